-- slo_targets: one row. The SLO every attribution relation (and every good / slow count of
-- audit.queries) judges against. A reader sets the session variables (audit.SLO.variables());
-- unset variables fall back to the defaults below, the only place they are written:
-- audit.SLO() reads them from here.
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
