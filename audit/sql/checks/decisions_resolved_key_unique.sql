-- int_attr_decisions_resolved: decision_key (a hash of the grain) is present and unique, so
-- the candidate relations that join on it never drop a decision's candidates or join them to
-- another decision's.
select cast(decision_key as varchar) as decision_key, count(*) as row_count
from int_attr_decisions_resolved
group by decision_key
having count(*) > 1 or decision_key is null
