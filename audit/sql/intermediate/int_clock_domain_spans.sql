-- int_clock_domain_spans: one row per time partition and clock domain with spans starting in
-- the partition on their own clock (grain: part, clock_domain): how many spans, client spans
-- and router spans. Counts add up, so a window of partitions is the sum of its partitions'
-- rows: int_clock_offsets picks each window's reference domain from them, and a slice of event
-- time reads the partitions before its own as stored rows (docs/clock.md).
with

spans as (
    select * from stg_spans
),

partitioning as (
    select * from stg_partitioning
),

final as (
    select
        spans.start_ns // partitioning.partition_ns as part,
        spans.clock_domain,
        count(*) filter (where spans.span_role = 'client') as client_spans,
        count(*) filter (where spans.span_role like 'router_%') as router_spans,
        count(*) as spans
    from spans
    cross join partitioning
    group by all
)

select * from final
