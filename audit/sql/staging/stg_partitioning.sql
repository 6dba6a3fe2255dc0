-- stg_partitioning: one row. How event time is cut into partitions and when a partition's
-- verdicts are final (docs/architecture.md, "Always-on analysis"). A store keeps its settings in
-- routeaudit_meta (keys partition_s, window_partitions, lateness_s, max_request_s), written
-- when it is created (audit/_store.py, DEFAULT_PARTITIONING, for the keys it is not given);
-- the fallbacks below apply to a store that recorded none. Changing them means rebuilding
-- every relation.
with

settings as (
    select
        max(try_cast(value as double)) filter (where key = 'partition_s') as partition_s,
        max(try_cast(value as bigint)) filter (where key = 'window_partitions')
            as window_partitions,
        max(try_cast(value as double)) filter (where key = 'lateness_s') as lateness_s,
        max(try_cast(value as double)) filter (where key = 'max_request_s') as max_request_s,
        max(try_cast(value as bigint)) filter (where key = 'judge_from_ns') as judge_from_ns,
        max(try_cast(value as bigint)) filter (where key = 'context_from_ns') as context_from_ns
    from routeaudit_meta
),

final as (
    select
        -- width of a partition of event time, seconds
        coalesce(partition_s, 300.0) as partition_s,
        cast(coalesce(partition_s, 300.0) * 1e9 as bigint) as partition_ns,
        -- windowed summaries of partition p read partitions p - window_partitions .. p
        coalesce(window_partitions, 2) as window_partitions,
        -- the watermark is the newest span start minus this, seconds
        coalesce(lateness_s, 30.0) as lateness_s,
        -- a request receives no span later than this after its anchor, seconds
        coalesce(max_request_s, 600.0) as max_request_s,
        -- set only inside an incremental refresh's slice (never stored): requests anchored
        -- before it are context there, read but not judged
        judge_from_ns,
        -- set only inside a slice whose windows read stored rows: the candidates of requests
        -- anchored before it are read by no row of the slice's own (not looked up)
        context_from_ns
    from settings
)

select * from final
