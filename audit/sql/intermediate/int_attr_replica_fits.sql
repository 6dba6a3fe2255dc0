-- int_attr_replica_fits: one row per (partition, run, replica) with executions in the
-- partition's window: the raw prefill fit (least squares of prefill_ms on uncached tokens, and
-- the ratio) and decode ms/token, plus the run's pooled values, and the run's idle fit
-- (executions whose prefill started on a replica with nothing queued or prefilling and shared no
-- step with another prefill, each scaled to the fleet's median speed): what a prompt costs on a
-- nominal idle replica, the long_prompt reference; and each replica's own prefills that ran alone
-- (their sums, unscaled), which the idle fit measures the replica's speed on. The summary of partition p learns from the
-- executions of the run's requests in partitions p - window_partitions .. p (stg_partitioning):
-- a later partition never moves it, and a replica whose speed drifts is followed partition by
-- partition. Rows exist for the partitions holding requests of the run. Independent of the
-- thresholds: int_attr_candidates_estimated chooses between them with calibration_min_n.
-- docs/attribution.md, "Calibration".
with

timed as (
    select * from int_attr_executions_timed
),

idle_solo as (
    select
        request_key,
        span_id
    from int_attr_idle_prefills
),

all_requests as (
    select * from requests
),

window_offsets as (
    -- an execution counts in the window of its own partition and of the next
    -- window_partitions ones: shifting it by each offset makes the windows an equi-join
    select unnest(range(window_partitions + 1)) as partitions_later
    from stg_partitioning
),

run_partitions as (
    -- the partitions a summary is wanted for: those holding requests of the run
    select distinct
        run_id,
        part
    from all_requests
),

calibration_points as (
    -- part: the partition whose summary the execution counts in
    select
        w.part,
        t.run_id,
        t.replica,
        t.request_key,
        t.span_id,
        t.prefill_ms,
        -- whole microseconds: the fits below sum integers, exactly, so their result does not
        -- depend on the order rows reach the aggregate (a sum of doubles does, in its last bits,
        -- and two equal estimates then compare by that noise)
        cast(round(t.prefill_ms * 1000.0) as bigint) as prefill_us,
        t.uncached_tokens,
        coalesce(t.cached_tokens, 0) as cached_tokens,
        case
            when t.output_tokens >= 2 and t.decode_ms is not null
                then t.decode_ms / (t.output_tokens - 1)
        end as decode_ms_per_token
    from timed as t
    cross join window_offsets as o
    inner join run_partitions as w
        on t.part + o.partitions_later = w.part
        and t.run_id is not distinct from w.run_id
    where t.replica is not null
),

replica_sums as (
    select
        part,
        run_id,
        replica,
        count(prefill_ms) filter (where uncached_tokens > 0) as prefill_n,
        -- least squares from exact integer sums (microseconds, tokens): the same points give
        -- the same bits in any order
        count(prefill_us) filter (where uncached_tokens > 0) as n_fit,
        sum(cast(uncached_tokens as hugeint))
            filter (where uncached_tokens > 0 and prefill_us is not null) as sx,
        sum(cast(prefill_us as hugeint)) filter (where uncached_tokens > 0) as sy,
        sum(cast(uncached_tokens as hugeint) * uncached_tokens)
            filter (where uncached_tokens > 0 and prefill_us is not null) as sxx,
        sum(cast(uncached_tokens as hugeint) * prefill_us)
            filter (where uncached_tokens > 0) as sxy,
        median(decode_ms_per_token) as decode_ms_per_token
    from calibration_points
    group by all
),

pooled_sums as (
    select
        part,
        run_id,
        -- least squares from exact integer sums (microseconds, tokens): the same points give
        -- the same bits in any order
        count(prefill_us) filter (where uncached_tokens > 0) as n_fit,
        sum(cast(uncached_tokens as hugeint))
            filter (where uncached_tokens > 0 and prefill_us is not null) as sx,
        sum(cast(prefill_us as hugeint)) filter (where uncached_tokens > 0) as sy,
        sum(cast(uncached_tokens as hugeint) * uncached_tokens)
            filter (where uncached_tokens > 0 and prefill_us is not null) as sxx,
        sum(cast(uncached_tokens as hugeint) * prefill_us)
            filter (where uncached_tokens > 0) as sxy,
        median(decode_ms_per_token) as pooled_decode_ms_per_token
    from calibration_points
    group by all
),

calibration_per_replica as (
    -- a fit needs spread in prompt length (den > 0); ms from microseconds
    select
        part,
        run_id,
        replica,
        prefill_n,
        case
            when n_fit * sxx - sx * sx > 0
                then cast(n_fit * sxy - sx * sy as double)
                / cast(n_fit * sxx - sx * sx as double) / 1000.0
        end as fit_slope,
        case
            when n_fit * sxx - sx * sx > 0
                then cast(sy * sxx - sx * sxy as double)
                / cast(n_fit * sxx - sx * sx as double) / 1000.0
        end as fit_intercept,
        cast(sy as double) / nullif(cast(sx as double), 0.0) / 1000.0 as fit_ratio,
        decode_ms_per_token
    from replica_sums
),

calibration_pooled as (
    select
        part,
        run_id,
        case
            when n_fit * sxx - sx * sx > 0
                then cast(n_fit * sxy - sx * sy as double)
                / cast(n_fit * sxx - sx * sx as double) / 1000.0
        end as pooled_slope,
        case
            when n_fit * sxx - sx * sx > 0
                then cast(sy * sxx - sx * sxy as double)
                / cast(n_fit * sxx - sx * sx as double) / 1000.0
        end as pooled_intercept,
        cast(sy as double) / nullif(cast(sx as double), 0.0) / 1000.0 as pooled_ratio,
        pooled_decode_ms_per_token
    from pooled_sums
),

speed_scale as (
    -- a replica's prefill ms/token relative to the run's median replica, in the same window
    select
        part,
        run_id,
        replica,
        median(fit_ratio) over (partition by part, run_id)
        / nullif(fit_ratio, 0) as scale
    from calibration_per_replica
),

idle_points as (
    -- integers (microseconds, tokens, twice the attention regressor) so that the moments
    -- below are exact sums, the same in any row order
    select
        p.part,
        p.run_id,
        cast(round(p.prefill_us * coalesce(k.scale, 1.0)) as hugeint) as y,
        cast(p.uncached_tokens as hugeint) as x1,
        -- attention: each prompt token attends to every earlier one (cached ones included);
        -- x2h = 2 * uncached * (cached + uncached / 2)
        cast(p.uncached_tokens as hugeint) * (2 * p.cached_tokens + p.uncached_tokens) as x2h
    from calibration_points as p
    inner join idle_solo as i
        on p.request_key = i.request_key
        and p.span_id = i.span_id
    left join speed_scale as k
        on p.part = k.part
        and p.run_id is not distinct from k.run_id
        and p.replica = k.replica
    where p.uncached_tokens > 0 and p.prefill_us is not null
),

solo_sums as (
    -- per replica, its prefills that ran alone (unscaled): the time they took and the idle
    -- fit's regressors summed, so that the idle fit's prediction for them is linear in these
    -- sums (int_attr_candidates_estimated: the replica's speed). Exact integer sums
    select
        p.part,
        p.run_id,
        p.replica,
        count(*) as solo_n,
        sum(cast(p.prefill_us as hugeint)) as sy,
        sum(cast(p.uncached_tokens as hugeint)) as s1,
        sum(cast(p.uncached_tokens as hugeint) * (2 * p.cached_tokens + p.uncached_tokens))
            as s2h
    from calibration_points as p
    inner join idle_solo as i
        on p.request_key = i.request_key
        and p.span_id = i.span_id
    where p.uncached_tokens > 0 and p.prefill_us is not null
    group by all
),

idle_sums as (
    select
        part,
        run_id,
        count(*) as n,
        sum(y) as sy,
        sum(x1) as s1,
        sum(x2h) as s2,
        sum(x1 * x1) as s11,
        sum(x2h * x2h) as s22,
        sum(x1 * x2h) as s12,
        sum(x1 * y) as s1y,
        sum(x2h * y) as s2y
    from idle_points
    group by all
),

idle_moments as (
    -- population (co)variances in ms and tokens: exact n * sum(ab) - sum(a) * sum(b), then
    -- scaled
    select
        part,
        run_id,
        n as idle_n,
        cast(sy as double) / n / 1000.0 as my,
        cast(s1 as double) / n as m1,
        cast(s2 as double) / n / 2.0 as m2,
        cast(n * s11 - s1 * s1 as double) / n / n as s11,
        cast(n * s22 - s2 * s2 as double) / n / n / 4.0 as s22,
        cast(n * s12 - s1 * s2 as double) / n / n / 2.0 as s12,
        cast(n * s1y - s1 * sy as double) / n / n / 1000.0 as s1y,
        cast(n * s2y - s2 * sy as double) / n / n / 2000.0 as s2y
    from idle_sums
),

calibration_idle as (
    -- least squares prefill_ms = intercept + slope * uncached + attn * uncached * (cached +
    -- uncached / 2) (two regressors, closed form); a linear fit when they are collinear
    select
        part,
        run_id,
        idle_n,
        case
            when s11 * s22 - s12 * s12 > 1e-9 * s11 * s22
                then (s22 * s1y - s12 * s2y) / (s11 * s22 - s12 * s12)
            when s11 > 0 then s1y / s11
        end as idle_slope,
        case
            when s11 * s22 - s12 * s12 > 1e-9 * s11 * s22
                then (s11 * s2y - s12 * s1y) / (s11 * s22 - s12 * s12)
            when s11 > 0 then 0.0
        end as idle_attn_ms_per_token2,
        my as idle_my,
        m1 as idle_m1,
        m2 as idle_m2
    from idle_moments
),

final as (
    select
        p.*,
        q.* exclude (part, run_id),
        i.idle_n,
        i.idle_slope,
        i.idle_attn_ms_per_token2,
        i.idle_my - i.idle_slope * i.idle_m1 - i.idle_attn_ms_per_token2 * i.idle_m2
            as idle_intercept,
        coalesce(o.solo_n, 0) as solo_n,
        cast(o.sy as double) / 1000.0 as solo_prefill_ms,
        cast(o.s1 as double) as solo_uncached_tokens,
        cast(o.s2h as double) / 2.0 as solo_attn_tokens2
    from calibration_per_replica as p
    left join calibration_pooled as q
        on p.part = q.part
        and p.run_id is not distinct from q.run_id
    left join calibration_idle as i
        on p.part = i.part
        and p.run_id is not distinct from i.run_id
    left join solo_sums as o
        on p.part = o.part
        and p.run_id is not distinct from o.run_id
        and p.replica = o.replica
)

select * from final
