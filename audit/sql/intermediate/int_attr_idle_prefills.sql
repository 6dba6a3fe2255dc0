-- int_attr_idle_prefills: one row per execution (request_key, span_id: a span id alone is unique
-- only within its trace) whose prefill ran alone: the chosen
-- replica had no request queued or in prefill at the decision (drain 0), and no other request's
-- prefill on that replica overlapped its prefill. These calibrate what a prompt costs on an idle
-- replica (int_attr_replica_fits). Its own relation with no shared CTE, and (replica, instant)
-- folded into one key: DuckDB then plans the overlap lookup as an IEJoin, linear in its output,
-- instead of a hash join on replica comparing every pair (quadratic in a replica's history).
with

idle_starts as (
    select distinct
        request_key,
        exec_span_id as span_id
    from int_attr_candidates_state
    where
        chosen
        and replica = exec_replica
        and drain_ms = 0
        and exec_span_id is not null
),

idle_prefills as (
    select
        e.request_key,
        e.span_id,
        e.replica,
        (cast(hash(e.replica) >> 2 as hugeint) << 64)
        + epoch_us(e.prefill_start_at) as prefill_start_key,
        (cast(hash(e.replica) >> 2 as hugeint) << 64)
        + epoch_us(e.first_token_at) as first_token_key
    from int_attr_executions_timed as e
    semi join idle_starts as i
        on e.request_key = i.request_key
        and e.span_id = i.span_id
),

all_prefills as (
    select
        request_key,
        span_id,
        replica,
        (cast(hash(replica) >> 2 as hugeint) << 64)
        + epoch_us(prefill_start_at) as prefill_start_key,
        (cast(hash(replica) >> 2 as hugeint) << 64)
        + epoch_us(first_token_at) as first_token_key
    from int_attr_executions_timed
),

prefill_overlaps as (
    -- the hash key could only mix replicas on a 62-bit collision; the replica is re-checked.
    -- One reference per CTE: a CTE read twice is materialised, and then no IEJoin is planned
    select
        e.request_key,
        e.span_id,
        coalesce(bool_or(o.replica = e.replica), false) as shared
    from idle_prefills as e
    left join all_prefills as o
        on o.prefill_start_key < e.first_token_key
        and o.first_token_key > e.prefill_start_key
        and (o.span_id <> e.span_id or o.request_key <> e.request_key)
    group by e.request_key, e.span_id
),

final as (
    select
        request_key,
        span_id
    from prefill_overlaps
    where not shared
)

select * from final
