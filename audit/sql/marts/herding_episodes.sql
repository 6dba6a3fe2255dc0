-- herding_episodes: one row per episode: at least herding_min_decisions decisions (from any
-- router) sent to one replica on the same telemetry sample of it, while the routers' pending
-- counts left some of those assignments unreflected. true_waiting_last is the replica's true
-- queue when the episode's last decision was made; slow_requests counts its slow members.
-- part is the latest partition among its members' requests: an incremental refresh that
-- recomputes a member recomputes its episode.
with

assessed as (
    select * from int_attr_candidates_assessed
),

thresholds as (
    select * from int_attr_thresholds
),

chosen_rows as (
    select *
    from assessed
    where chosen and chosen_telemetry_ts is not null
),

episodes as (
    select
        c.run_id,
        c.replica,
        c.chosen_telemetry_ts as telemetry_ts,
        max(c.part) as part,
        min(c.decided_at) as started_at,
        max(c.decided_at) as ended_at,
        count(*) as decisions,
        count(distinct coalesce(c.decision_router_id, c.router_id)) as routers,
        max(c.seen_pending) as max_pending_seen,
        max(c.episode_unreflected) as unreflected_assignments,
        -- what the episode's first decision saw (routers may have recorded it differently)
        arg_min(c.seen_waiting, (c.episode_rank, c.request_key)) as seen_waiting,
        -- episode_rank orders by decision instant with ties broken by request, so a rebuild
        -- names the same last decision and lists the requests in the same order
        arg_max(c.true_waiting, (c.episode_rank, c.request_key)) as true_waiting_last,
        count(*) filter (where c.is_slow) as slow_requests,
        count(*) filter (where c.in_herding_episode and c.is_slow)
            as slow_unreflected,
        string_agg(c.request_id, ',' order by c.episode_rank, c.request_key)
            as request_ids,
        -- the same requests by key (request ids may repeat)
        string_agg(c.request_key, ',' order by c.episode_rank, c.request_key)
            as request_keys
    from chosen_rows as c
    cross join thresholds as t
    group by c.run_id, c.replica, c.chosen_telemetry_ts, t.herding_min_decisions
    having
        count(*) >= t.herding_min_decisions
        and max(c.episode_unreflected) > 0
),

final as (
    select
        md5(
            concat_ws('|', run_id, replica, cast(telemetry_ts as varchar))
        ) as episode_id,
        *,
        date_diff('microsecond', started_at, ended_at) / 1000.0 as span_ms,
        printf(
            '%d decisions from %d router(s) onto %s on one telemetry sample (seen waiting %s); '
            || 'pending reflected at most %s; true waiting reached %d',
            decisions,
            routers,
            replica,
            coalesce(printf('%.0f', seen_waiting), '?'),
            coalesce(cast(max_pending_seen as varchar), 'none'),
            true_waiting_last
        ) as evidence
    from episodes
)

select * from final
