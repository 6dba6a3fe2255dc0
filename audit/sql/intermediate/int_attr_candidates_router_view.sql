-- int_attr_candidates_router_view: one row per (decision, worker) for a decision reconstructed
-- from a third-party router's spans (recorded = false) whose router's own /metrics named the
-- worker at or before the decision (grain: decision_key, replica): the latest such
-- `source = 'router'` snapshot row, the router's view of the worker when it records no decision
-- (its requests in flight there, its health verdict, the engine load it re-exports, and the
-- row's age). int_attr_candidates_resolved takes a reconstructed candidate's view from here when
-- a row exists (view_source = 'router_metrics'), from the engines' scrapes otherwise.
--
-- Which router's /metrics: a scrape target is a router target once it gave `source = 'router'`
-- rows; it is the deciding router's when its latest scrape at or before the decision answered
-- with workers' rows (a router stopped or not yet started answers with a failed row, or with
-- nothing about its workers) and it is the only router target doing so then. Snapshots carry no
-- router identity, so with two routers' /metrics current at one instant no decision takes
-- either's view. Everything read is at or before the decision.
with

decisions_resolved as (
    select * from int_attr_decisions_resolved
),

all_snapshots as (
    select * from snapshots
),

-- one router's view of one worker at one scrape: a worker's ranks added up like the engines'
router_views as (
    select
        target,
        replica,
        scraped_at,
        sum(waiting) as waiting,
        sum(running) as running,
        max(kv_usage) as kv_usage,
        max(router_in_flight) as router_in_flight,
        bool_and(router_healthy) as router_healthy
    from all_snapshots
    where ok and source = 'router'
    group by all
),

router_targets as (
    select distinct target
    from router_views
),

-- every scrape of a router target, and whether it answered with its workers' rows
router_target_scrapes as (
    select
        s.target,
        s.scraped_at,
        bool_or(s.ok and s.source = 'router') as answered
    from all_snapshots as s
    semi join router_targets as t
        on s.target = t.target
    group by all
),

decision_targets as (
    select
        d.decision_key,
        d.request_key,
        d.attempt,
        d.decision_span_id,
        d.decided_at,
        t.target
    from decisions_resolved as d
    cross join router_targets as t
    where not d.recorded
        and d.decided_at is not null
),

decision_targets_current as (
    select dt.*
    from decision_targets as dt
    asof inner join router_target_scrapes as s
        on dt.target = s.target
        and dt.decided_at >= s.scraped_at
    where s.answered
),

decision_routers as (
    select
        decision_key,
        any_value(request_key) as request_key,
        any_value(attempt) as attempt,
        any_value(decision_span_id) as decision_span_id,
        any_value(decided_at) as decided_at,
        any_value(target) as view_target
    from decision_targets_current
    group by decision_key
    having count(*) = 1
),

decision_workers as (
    select
        r.*,
        w.replica
    from decision_routers as r
    inner join (select distinct target, replica from router_views) as w
        on r.view_target = w.target
),

final as (
    select
        w.decision_key,
        w.request_key,
        w.attempt,
        w.decision_span_id,
        w.replica,
        w.view_target,
        v.scraped_at as view_ts,
        date_diff('microsecond', v.scraped_at, w.decided_at) / 1000.0 as view_age_ms,
        v.router_in_flight,
        v.router_healthy,
        v.waiting,
        v.running,
        v.kv_usage,
        'router_metrics' as view_source
    from decision_workers as w
    asof inner join router_views as v
        on w.view_target = v.target
        and w.replica = v.replica
        and w.decided_at >= v.scraped_at
)

select * from final
