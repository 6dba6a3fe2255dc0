-- candidates: one row per candidate event of a decision, attached to a known decision.
select candidates.decision_id, candidates.event_index, count(*) as row_count
from candidates
left join decisions
    on decisions.decision_id = candidates.decision_id
group by candidates.decision_id, candidates.event_index
having count(*) > 1 or count(decisions.decision_id) = 0
