-- int_spans_anchored_by_trace: one row per side span (client, router_*, replica; probes
-- excluded) with the span that anchors its request inside its own trace (grain: trace_id,
-- span_id). Walks the parent chain: the anchor is the nearest client ancestor-or-self, else the
-- topmost router ancestor-or-self, else the topmost replica ancestor-or-self.
with recursive

stg_spans_source as (

    select * from stg_spans

),

side_spans as (

    select
        trace_id,
        span_id,
        parent_span_id,
        span_role,
        start_ns
    from stg_spans_source
    where span_role <> 'other'
        and not is_probe

),

ancestry as (

    -- each step carries the ancestor's role and probe flag with it, so no join looks them up
    select
        side_spans.trace_id,
        side_spans.span_id,
        side_spans.span_id as ancestor_span_id,
        side_spans.parent_span_id as next_span_id,
        side_spans.span_role as ancestor_role,
        false as ancestor_is_probe,
        side_spans.span_role,
        0 as depth
    from side_spans

    union all

    select
        ancestry.trace_id,
        ancestry.span_id,
        parent_spans.span_id as ancestor_span_id,
        parent_spans.parent_span_id as next_span_id,
        parent_spans.span_role as ancestor_role,
        parent_spans.is_probe as ancestor_is_probe,
        ancestry.span_role,
        ancestry.depth + 1 as depth
    from ancestry
    inner join stg_spans_source as parent_spans
        on parent_spans.trace_id = ancestry.trace_id
        and parent_spans.span_id = ancestry.next_span_id
    where ancestry.depth < 64

),

anchors_per_span as (

    -- every side span has its own row (depth 0, never a probe), so every one has a group
    select
        trace_id,
        span_id,
        any_value(span_role) as span_role,
        min_by(ancestor_span_id, depth)
            filter (where ancestor_role = 'client') as nearest_client_span_id,
        max_by(ancestor_span_id, depth)
            filter (where ancestor_role like 'router_%')
            as topmost_router_span_id,
        max_by(ancestor_span_id, depth)
            filter (where ancestor_role = 'replica')
            as topmost_replica_span_id
    from ancestry
    where not ancestor_is_probe
    group by trace_id, span_id

),

final as (

    select
        trace_id,
        span_id,
        span_role,
        coalesce(
            nearest_client_span_id,
            topmost_router_span_id,
            topmost_replica_span_id,
            span_id
        ) as anchor_span_id,
        case
            when nearest_client_span_id is not null
                then 'client'
            when topmost_router_span_id is not null
                then 'router'
            else 'replica'
        end as anchor_role
    from anchors_per_span

)

select * from final
