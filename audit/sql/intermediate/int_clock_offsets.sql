-- int_clock_offsets: one row per time partition and clock domain with spans in it (grain: part,
-- clock_domain) with the domain's offset from the reference domain in that partition:
-- corrected_ns = observed_ns - offset_ns, for a span whose start on its own clock falls in the
-- partition (part = start_ns // stg_partitioning.partition_ns).
--
-- Partition p reads only the window of partitions p - window_partitions .. p: their bounds,
-- merged per domain pair (max of lower bounds, min of upper bounds, as in
-- int_clock_bounds_per_domain_pair), and their span counts for the reference
-- (int_clock_domain_spans). So a drifting clock is followed window by window, and a later
-- partition never changes an earlier one's offsets.
-- The reference is the window's domain with the most client spans, else the most router spans,
-- else the most spans (ties: name). Offsets propagate breadth-first from the reference over
-- the window's domain pairs, a recursive walk with no hop limit (client -> router -> replica is
-- 2); each domain is reached by the fewest hops, through the neighbour with the most span
-- pairs. The estimate is rounded to 100 us (kept within the bounds), so a new pair that
-- tightens the bounds by a few us rarely moves it. Status: reference / bounded / inconsistent
-- (an edge on its path or touching it has empty bounds in the window: clock jump or drift) /
-- unbounded (not connected to the reference: offset taken as 0). See docs/clock.md.
with recursive

stg_partitioning_source as not materialized (

    select * from stg_partitioning

),

int_clock_bounds_per_domain_pair_source as not materialized (

    select * from int_clock_bounds_per_domain_pair

),

domains_per_part as materialized (

    select * from int_clock_domain_spans

),

parts_with_spans as materialized (

    select distinct part
    from domains_per_part

),

-- each partition's rows are lent to the windows that read it: those of partitions
-- part .. part + window_partitions (the ones with spans)
windows_reading_part as materialized (

    select unnest(range(partitioning.window_partitions + 1)) as ahead
    from stg_partitioning_source as partitioning

),

domains_per_window as materialized (

    select
        domains_per_part.part + windows_reading_part.ahead as part,
        domains_per_part.clock_domain,
        sum(domains_per_part.client_spans) as client_spans,
        sum(domains_per_part.router_spans) as router_spans,
        sum(domains_per_part.spans) as spans,
        bool_or(windows_reading_part.ahead = 0) as has_spans_in_part
    from domains_per_part
    cross join windows_reading_part
    semi join parts_with_spans
        on domains_per_part.part + windows_reading_part.ahead
        = parts_with_spans.part
    group by all

),

reference_domain as materialized (

    select
        part,
        clock_domain
    from domains_per_window
    qualify row_number() over (
        partition by part
        order by
            client_spans desc,
            router_spans desc,
            spans desc,
            clock_domain asc
    ) = 1

),

bounds_per_window as materialized (

    select
        bounds.part + windows_reading_part.ahead as part,
        bounds.domain_a,
        bounds.domain_b,
        sum(bounds.pair_count) as pair_count,
        max(bounds.lower_ns) as lower_ns,
        min(bounds.upper_ns) as upper_ns,
        -- an empty window's estimate: the median over its partitions of their medians
        median(bounds.median_midpoint_ns) as median_midpoint_ns
    from int_clock_bounds_per_domain_pair_source as bounds
    cross join windows_reading_part
    semi join parts_with_spans
        on bounds.part + windows_reading_part.ahead = parts_with_spans.part
    group by all

),

edges_per_window as materialized (

    select
        part,
        domain_a,
        domain_b,
        pair_count,
        lower_ns,
        upper_ns,
        coalesce(lower_ns <= upper_ns, true) as is_consistent,
        cast(
            case
                when lower_ns is null then upper_ns
                when upper_ns is null then lower_ns
                when lower_ns <= upper_ns then (lower_ns + upper_ns) / 2.0
                else median_midpoint_ns
            end as bigint
        ) as offset_a_minus_b_ns
    from bounds_per_window

),

directed_edges as materialized (

    select
        part,
        domain_a as from_domain,
        domain_b as to_domain,
        -offset_a_minus_b_ns as delta_ns,
        -upper_ns as delta_lower_ns,
        -lower_ns as delta_upper_ns,
        pair_count,
        is_consistent
    from edges_per_window

    union all

    select
        part,
        domain_b as from_domain,
        domain_a as to_domain,
        offset_a_minus_b_ns as delta_ns,
        lower_ns as delta_lower_ns,
        upper_ns as delta_upper_ns,
        pair_count,
        is_consistent
    from edges_per_window

),

domains_with_inconsistent_edges as materialized (

    select
        part,
        domain_a as clock_domain
    from edges_per_window
    where not is_consistent

    union

    select
        part,
        domain_b as clock_domain
    from edges_per_window
    where not is_consistent

),

-- Breadth-first, one level per iteration, each partition's walk on its own: every row of a
-- level carries the domains its partition reached so far (the same list on each), so a level
-- reaches only domains no earlier level did, each through its neighbour with the most span
-- pairs (ties: name). A partition's walk ends when a level reaches no new domain: at most one
-- level per domain, with no limit on the path length.
offsets_reached as (

    select
        part,
        clock_domain,
        cast(0 as bigint) as offset_ns,
        cast(0 as bigint) as lower_ns,
        cast(0 as bigint) as upper_ns,
        true as path_consistent,
        0 as hops,
        cast(null as varchar) as via_domain,
        [clock_domain] as domains_reached
    from reference_domain

    union all

    select
        offsets_reached.part,
        directed_edges.to_domain as clock_domain,
        offsets_reached.offset_ns + directed_edges.delta_ns as offset_ns,
        offsets_reached.lower_ns + directed_edges.delta_lower_ns as lower_ns,
        offsets_reached.upper_ns + directed_edges.delta_upper_ns as upper_ns,
        offsets_reached.path_consistent and directed_edges.is_consistent
            as path_consistent,
        offsets_reached.hops + 1 as hops,
        directed_edges.from_domain as via_domain,
        list_concat(
            offsets_reached.domains_reached,
            list(distinct directed_edges.to_domain)
                over (partition by offsets_reached.part)
        ) as domains_reached
    from offsets_reached
    inner join directed_edges
        on offsets_reached.part = directed_edges.part
        and offsets_reached.clock_domain = directed_edges.from_domain
    where
        not list_contains(
            offsets_reached.domains_reached, directed_edges.to_domain
        )
    qualify row_number() over (
        partition by offsets_reached.part, directed_edges.to_domain
        order by directed_edges.pair_count desc, directed_edges.from_domain asc
    ) = 1

),

offsets_rounded as materialized (

    select
        *,
        -- to 100 us, unless that leaves the bounds (a consistent path only)
        cast(round(offset_ns / 100000.0) * 100000 as bigint) as rounded_ns
    from offsets_reached

),

final as (

    select
        domains_per_window.part,
        domains_per_window.clock_domain,
        case
            when offsets_rounded.lower_ns > offsets_rounded.upper_ns
                then offsets_rounded.rounded_ns
            else coalesce(
                least(
                    greatest(offsets_rounded.rounded_ns, offsets_rounded.lower_ns),
                    offsets_rounded.upper_ns
                ),
                0
            )
        end as offset_ns,
        offsets_rounded.lower_ns as offset_lower_ns,
        offsets_rounded.upper_ns as offset_upper_ns,
        offsets_rounded.hops,
        offsets_rounded.via_domain,
        case
            when offsets_rounded.hops = 0 then 'reference'
            when offsets_rounded.clock_domain is null then 'unbounded'
            when not offsets_rounded.path_consistent
                or domains_with_inconsistent_edges.clock_domain is not null
                then 'inconsistent'
            else 'bounded'
        end as clock_status
    from domains_per_window
    left join offsets_rounded
        on domains_per_window.part = offsets_rounded.part
        and domains_per_window.clock_domain = offsets_rounded.clock_domain
    left join domains_with_inconsistent_edges
        on domains_per_window.part = domains_with_inconsistent_edges.part
        and domains_per_window.clock_domain
        = domains_with_inconsistent_edges.clock_domain
    where domains_per_window.has_spans_in_part

)

select * from final
