-- slo_targets: one row. The SLO every attribution relation judges against.
-- The Python side sets the session variables (`set variable routeaudit_ttft_slo_ms = ...`);
-- unset variables fall back to the defaults below (TTFT 2000 ms, TPOT 100 ms).
with

targets as (
    select
        cast(
            coalesce(getvariable('routeaudit_ttft_slo_ms'), 2000.0) as double
        ) as ttft_slo_ms,
        cast(
            coalesce(getvariable('routeaudit_tpot_slo_ms'), 100.0) as double
        ) as tpot_slo_ms
),

final as (
    select * from targets
)

select * from final
