-- int_clock_offsets: one row per clock domain (grain: clock_domain) with its offset from the
-- reference domain: corrected_ns = observed_ns - offset_ns. The reference is the domain with
-- the most client spans, else the most router spans, else the most spans (ties: name).
-- Offsets propagate breadth-first from the reference over int_clock_bounds_per_domain_pair, a
-- recursive walk with no hop limit (client -> router -> replica is 2); each domain is reached
-- by the fewest hops, through the neighbour with the most span pairs. Status: reference /
-- bounded / inconsistent (an edge on its path or touching it has empty bounds: clock jump or
-- drift) / unbounded (not connected to the reference: offset taken as 0). See docs/clock.md.
with recursive

stg_spans_source as not materialized (

    select * from stg_spans

),

int_clock_bounds_per_domain_pair_source as not materialized (

    select * from int_clock_bounds_per_domain_pair

),

domains as materialized (

    select
        clock_domain,
        count(*) filter (where span_role = 'client') as client_spans,
        count(*) filter (where span_role like 'router_%') as router_spans,
        count(*) as spans
    from stg_spans_source
    group by clock_domain

),

reference_domain as materialized (

    select clock_domain
    from domains
    order by client_spans desc, router_spans desc, spans desc, clock_domain asc
    limit 1

),

directed_edges as materialized (

    select
        domain_a as from_domain,
        domain_b as to_domain,
        -offset_a_minus_b_ns as delta_ns,
        -upper_ns as delta_lower_ns,
        -lower_ns as delta_upper_ns,
        pair_count,
        is_consistent
    from int_clock_bounds_per_domain_pair_source

    union all

    select
        domain_b as from_domain,
        domain_a as to_domain,
        offset_a_minus_b_ns as delta_ns,
        lower_ns as delta_lower_ns,
        upper_ns as delta_upper_ns,
        pair_count,
        is_consistent
    from int_clock_bounds_per_domain_pair_source

),

domains_with_inconsistent_edges as materialized (

    select domain_a as clock_domain
    from int_clock_bounds_per_domain_pair_source
    where not is_consistent

    union

    select domain_b as clock_domain
    from int_clock_bounds_per_domain_pair_source
    where not is_consistent

),

-- Breadth-first, one level per iteration: every row of a level carries the domains reached
-- so far (the same list on each), so a level reaches only domains no earlier level did, each
-- through its neighbour with the most span pairs (ties: name). The walk ends when a level
-- reaches no new domain: at most one level per domain, with no limit on the path length.
offsets_reached as (

    select
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
            list(distinct directed_edges.to_domain) over ()
        ) as domains_reached
    from offsets_reached
    inner join directed_edges
        on offsets_reached.clock_domain = directed_edges.from_domain
    where
        not list_contains(
            offsets_reached.domains_reached, directed_edges.to_domain
        )
    qualify row_number() over (
        partition by directed_edges.to_domain
        order by directed_edges.pair_count desc, directed_edges.from_domain asc
    ) = 1

),

final as (

    select
        domains.clock_domain,
        coalesce(offsets_reached.offset_ns, 0) as offset_ns,
        offsets_reached.lower_ns as offset_lower_ns,
        offsets_reached.upper_ns as offset_upper_ns,
        offsets_reached.hops,
        offsets_reached.via_domain,
        case
            when offsets_reached.hops = 0 then 'reference'
            when offsets_reached.clock_domain is null then 'unbounded'
            when not offsets_reached.path_consistent
                or domains_with_inconsistent_edges.clock_domain is not null
                then 'inconsistent'
            else 'bounded'
        end as clock_status
    from domains
    left join offsets_reached
        on offsets_reached.clock_domain = domains.clock_domain
    left join domains_with_inconsistent_edges
        on domains_with_inconsistent_edges.clock_domain = domains.clock_domain

)

select * from final
