-- int_attr_candidates_assessed: one row per candidate replica per routing decision (plus one
-- row for a request with no decision or no candidate), carrying the request judged against the
-- SLO (int_attr_requests_judged), the decision, what the router saw, the candidate's TRUE state
-- at the decision instant and the TTFT the request would have had there
-- (int_attr_candidates_estimated). predicted_cached_tokens is the request's (its final
-- decision's chosen replica), candidate_predicted_cached_tokens the router's prediction for this
-- candidate. docs/attribution.md has the formulas.
with

judged as (
    select * from int_attr_requests_judged
),

estimated as (
    select * from int_attr_candidates_estimated
),

final as (
    select
        j.*,
        e.* exclude (request_key, input_tokens, predicted_cached_tokens),
        e.predicted_cached_tokens as candidate_predicted_cached_tokens
    from judged as j
    left join estimated as e
        on j.request_key = e.request_key
)

select * from final
