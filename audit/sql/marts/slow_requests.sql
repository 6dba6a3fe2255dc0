-- slow_requests: one row per request that needs explaining (succeeded but missed a target, or
-- timed out), with its primary cause, the ms it cost and the evidence: the dashboard's table.
with

attributed as (
    select * from attributions
),

primary_causes as (
    select *
    from attributed
    where is_primary
),

cause_counts as (
    select
        request_key,
        count(*) as causes,
        string_agg(cause, ', ' order by excess_ms desc, cause asc, sub_kind asc nulls first)
            as all_causes
    from attributed
    group by all
),

final as (
    select
        p.request_id,
        p.run_id,
        p.client_start,
        p.status,
        p.missed,
        p.ttft_ms,
        p.tpot_ms,
        p.over_slo_ms,
        p.cause,
        p.sub_kind,
        p.excess_ms,
        p.confidence,
        p.evidence,
        p.evidence_source,
        p.replica,
        p.router_id,
        p.policy,
        c.causes,
        c.all_causes,
        p.request_key
    from primary_causes as p
    inner join cause_counts as c
        on p.request_key = c.request_key
)

select * from final
