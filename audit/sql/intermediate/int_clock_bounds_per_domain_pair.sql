-- int_clock_bounds_per_domain_pair: one row per time partition and pair of clock domains that
-- have at least one span paired with an ancestor in the other domain (grain: part, domain_a,
-- domain_b, a < b). A pair belongs to the partition of the child span's start on its own clock
-- (part = start_ns // stg_partitioning.partition_ns): offsets are ms to s, far below a
-- partition, and the raw clock needs no correction first.
--
-- A span lies, on true time, within its nearest ancestor in another clock domain. With
-- d = offset(child domain) - offset(parent domain), observed child_start - d >= parent_start
-- and child_end - d <= parent_end, so d is in [child_end - parent_end, child_start -
-- parent_start]. Every pair is turned to d_ab = offset(domain_a) - offset(domain_b) and the
-- intervals of one partition are intersected. The bounds are mergeable: lower_ns is a max and
-- upper_ns a min, so the bounds of several partitions (int_clock_offsets reads a window of
-- them), or of one partition computed twice, combine by max and min again. An empty
-- intersection means the clocks are not consistent with one fixed offset (a clock jump, drift,
-- or a child that outlived its parent); its estimate is then the median of the per-pair
-- midpoints (median_midpoint_ns). See docs/clock.md.
--
-- A span that ended abnormally (cancelled, aborted, timed out or errored) gives no END bound:
-- a cancelled client span ends while the router's forward span (and the replica) carry on, so
-- child_end <= parent_end does not hold. Only its start bound is kept, whether it is the child
-- or the ancestor of the pair.
with recursive

stg_partitioning_source as not materialized (

    select * from stg_partitioning

),

stg_spans_source as materialized (

    select
        spans.*,
        spans.start_ns // partitioning.partition_ns as part,
        coalesce(
            otel_status = 'error'
            or lower(declared_status) in (
                'cancelled', 'canceled', 'aborted', 'abort', 'timeout', 'error'
            )
            or lower(finish_reason) = 'abort'
            or http_status = 499
            or http_status >= 500,
            false
        ) as ended_abnormally
    from stg_spans as spans
    cross join stg_partitioning_source as partitioning

),

-- Walk up from each span while the ancestors stay in its clock domain, and stop at the first
-- ancestor in another domain: the remote caller waits for this process, so the span lies
-- within it. In-process ancestors are skipped on purpose: a routeaudit.decision span ends
-- before its forward child does.
walk_up_to_other_domain as materialized (

    select
        spans.trace_id,
        spans.span_id,
        spans.part as origin_part,
        spans.clock_domain as origin_domain,
        spans.start_ns as origin_start_ns,
        spans.end_ns as origin_end_ns,
        spans.ended_abnormally as origin_abnormal,
        spans.parent_span_id as next_span_id,
        cast(null as varchar) as ancestor_domain,
        cast(null as bigint) as ancestor_start_ns,
        cast(null as bigint) as ancestor_end_ns,
        cast(null as boolean) as ancestor_abnormal,
        0 as depth
    from stg_spans_source as spans
    where spans.parent_span_id is not null

    union all

    select
        walk.trace_id,
        walk.span_id,
        walk.origin_part,
        walk.origin_domain,
        walk.origin_start_ns,
        walk.origin_end_ns,
        walk.origin_abnormal,
        parent_spans.parent_span_id as next_span_id,
        parent_spans.clock_domain as ancestor_domain,
        parent_spans.start_ns as ancestor_start_ns,
        parent_spans.end_ns as ancestor_end_ns,
        parent_spans.ended_abnormally as ancestor_abnormal,
        walk.depth + 1 as depth
    from walk_up_to_other_domain as walk
    inner join stg_spans_source as parent_spans
        on parent_spans.trace_id = walk.trace_id
        and parent_spans.span_id = walk.next_span_id
    where (
        walk.ancestor_domain is null
        or walk.ancestor_domain = walk.origin_domain
    )
        and walk.depth < 64

),

cross_domain_pairs as materialized (

    select
        origin_part as part,
        origin_domain as child_domain,
        ancestor_domain as parent_domain,
        -- no end bound when either span ended abnormally (null: ignored by max/min below)
        case
            when not (origin_abnormal or ancestor_abnormal)
                then origin_end_ns - ancestor_end_ns
        end as lower_ns,
        origin_start_ns - ancestor_start_ns as upper_ns
    from walk_up_to_other_domain
    where ancestor_domain <> origin_domain

),

pairs_oriented as materialized (

    select
        part,
        least(child_domain, parent_domain) as domain_a,
        greatest(child_domain, parent_domain) as domain_b,
        case
            when child_domain < parent_domain then lower_ns else -upper_ns
        end as lower_ns,
        case
            when child_domain < parent_domain then upper_ns else -lower_ns
        end as upper_ns
    from cross_domain_pairs

),

bounds_intersected as materialized (

    select
        part,
        domain_a,
        domain_b,
        count(*) as pair_count,
        max(lower_ns) as lower_ns,
        min(upper_ns) as upper_ns,
        -- over pairs with both bounds (a pair with an abnormal end has one only)
        median((lower_ns + upper_ns) / 2.0) as median_midpoint_ns
    from pairs_oriented
    group by part, domain_a, domain_b

),

final as (

    select
        part,
        domain_a,
        domain_b,
        pair_count,
        lower_ns,
        upper_ns,
        -- one side missing (every pair of the two domains ended abnormally): a half-bound,
        -- consistent by definition; the estimate is that bound
        coalesce(lower_ns <= upper_ns, true) as is_consistent,
        cast(
            case
                when lower_ns is null then upper_ns
                when upper_ns is null then lower_ns
                when lower_ns <= upper_ns then (lower_ns + upper_ns) / 2.0
                else median_midpoint_ns
            end as bigint
        ) as offset_a_minus_b_ns,
        cast(median_midpoint_ns as bigint) as median_midpoint_ns
    from bounds_intersected

)

select * from final
