-- int_requests_linked: one row per side span (grain: trace_id, span_id) with the logical
-- request it belongs to (request_key) and how its group was linked.
--
-- 1. int_spans_anchored_by_trace groups spans by parent chain (a "group" = one anchor).
-- 2. A group without a client (anchored on a router or replica span) is merged into a group of
--    better rank (client < router < replica) that is in the same trace (parent chain broken by
--    a missing span) or shares a request id (the router started a new trace, e.g. SMG; link by
--    x-request-id / x-correlation-id / vLLM's unwrapped gen_ai.request.id). Preference: shares
--    a request id, then same trace, then better rank, then nearest start time, then ids.
-- 3. Merges are followed twice (replica -> router -> client).
with

stg_spans_source as not materialized (

    select * from stg_spans

),

int_spans_anchored_by_trace_source as not materialized (

    select * from int_spans_anchored_by_trace

),

anchored_side_spans as materialized (

    select
        anchored.trace_id,
        anchored.span_id,
        anchored.span_role,
        anchored.anchor_span_id,
        anchored.anchor_role,
        spans.request_id,
        spans.run_id,
        spans.start_ns
    from int_spans_anchored_by_trace_source as anchored
    inner join stg_spans_source as spans
        on spans.trace_id = anchored.trace_id
        and spans.span_id = anchored.span_id

),

groups_by_anchor as materialized (

    select
        trace_id,
        anchor_span_id,
        min(anchor_role) as anchor_role,
        case min(anchor_role)
            when 'client' then 1
            when 'router' then 2
            else 3
        end as group_rank,
        min(start_ns) as group_start_ns,
        min(run_id) as run_id
    from anchored_side_spans
    group by trace_id, anchor_span_id

),

group_request_ids as materialized (

    select distinct
        trace_id,
        anchor_span_id,
        request_id
    from anchored_side_spans
    where request_id is not null

),

merge_candidates_by_trace as materialized (

    select
        from_group.trace_id,
        from_group.anchor_span_id,
        to_group.trace_id as to_trace_id,
        to_group.anchor_span_id as to_anchor_span_id,
        to_group.group_rank as to_group_rank,
        abs(to_group.group_start_ns - from_group.group_start_ns) as distance_ns,
        true as same_trace
    from groups_by_anchor as from_group
    inner join groups_by_anchor as to_group
        on to_group.trace_id = from_group.trace_id
        and to_group.group_rank < from_group.group_rank

),

merge_candidates_by_request_id as materialized (

    select
        from_ids.trace_id,
        from_ids.anchor_span_id,
        to_ids.trace_id as to_trace_id,
        to_ids.anchor_span_id as to_anchor_span_id,
        to_group.group_rank as to_group_rank,
        abs(to_group.group_start_ns - from_group.group_start_ns) as distance_ns,
        to_ids.trace_id = from_ids.trace_id as same_trace
    from group_request_ids as from_ids
    inner join group_request_ids as to_ids
        on to_ids.request_id = from_ids.request_id
    inner join groups_by_anchor as from_group
        on from_group.trace_id = from_ids.trace_id
        and from_group.anchor_span_id = from_ids.anchor_span_id
    inner join groups_by_anchor as to_group
        on to_group.trace_id = to_ids.trace_id
        and to_group.anchor_span_id = to_ids.anchor_span_id
    where to_group.group_rank < from_group.group_rank
        and (
            from_group.run_id is null
            or to_group.run_id is null
            or from_group.run_id = to_group.run_id
        )

),

merge_candidates_unioned as materialized (

    select
        *,
        false as shares_request_id
    from merge_candidates_by_trace

    union all

    select
        *,
        true as shares_request_id
    from merge_candidates_by_request_id

),

merge_candidates as materialized (

    select
        trace_id,
        anchor_span_id,
        to_trace_id,
        to_anchor_span_id,
        to_group_rank,
        distance_ns,
        bool_or(same_trace) as same_trace,
        bool_or(shares_request_id) as shares_request_id
    from merge_candidates_unioned
    group by
        trace_id,
        anchor_span_id,
        to_trace_id,
        to_anchor_span_id,
        to_group_rank,
        distance_ns

),

merge_candidates_ranked as materialized (

    select
        *,
        row_number() over (
            partition by trace_id, anchor_span_id
            order by
                shares_request_id desc,
                same_trace desc,
                to_group_rank asc,
                distance_ns asc,
                to_trace_id asc,
                to_anchor_span_id asc
        ) as preference
    from merge_candidates

),

first_merges as materialized (

    select
        trace_id,
        anchor_span_id,
        to_trace_id,
        to_anchor_span_id,
        case when same_trace then 'trace' else 'request_id' end as merge_method
    from merge_candidates_ranked
    where preference = 1

),

resolved_groups as materialized (

    select
        groups_by_anchor.trace_id,
        groups_by_anchor.anchor_span_id,
        coalesce(
            second_merge.to_trace_id,
            first_merge.to_trace_id,
            groups_by_anchor.trace_id
        ) as request_trace_id,
        coalesce(
            second_merge.to_anchor_span_id,
            first_merge.to_anchor_span_id,
            groups_by_anchor.anchor_span_id
        ) as request_anchor_span_id,
        case
            when first_merge.merge_method = 'request_id'
                or second_merge.merge_method = 'request_id'
                then 'request_id'
            when first_merge.merge_method is not null then 'trace'
        end as merge_method
    from groups_by_anchor
    left join first_merges as first_merge
        on first_merge.trace_id = groups_by_anchor.trace_id
        and first_merge.anchor_span_id = groups_by_anchor.anchor_span_id
    left join first_merges as second_merge
        on second_merge.trace_id = first_merge.to_trace_id
        and second_merge.anchor_span_id = first_merge.to_anchor_span_id

),

spans_with_request as materialized (

    select
        anchored_side_spans.trace_id,
        anchored_side_spans.span_id,
        anchored_side_spans.span_role,
        resolved_groups.request_trace_id,
        resolved_groups.request_anchor_span_id,
        resolved_groups.request_trace_id || '-'
        || resolved_groups.request_anchor_span_id as request_key,
        resolved_groups.merge_method
    from anchored_side_spans
    inner join resolved_groups
        on resolved_groups.trace_id = anchored_side_spans.trace_id
        and resolved_groups.anchor_span_id = anchored_side_spans.anchor_span_id

),

link_method_per_request as materialized (

    select
        request_key,
        case
            when bool_or(merge_method = 'request_id') then 'request_id'
            when count(distinct
                case when span_role like 'router_%' then 'router'
                    else span_role end) > 1 then 'trace'
            else 'none'
        end as link_method
    from spans_with_request
    group by request_key

),

final as (

    select
        spans_with_request.trace_id,
        spans_with_request.span_id,
        spans_with_request.span_role,
        spans_with_request.request_key,
        spans_with_request.request_trace_id,
        spans_with_request.request_anchor_span_id,
        link_method_per_request.link_method
    from spans_with_request
    inner join link_method_per_request
        on link_method_per_request.request_key = spans_with_request.request_key

)

select * from final
