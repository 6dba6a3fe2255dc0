-- herding_episodes: the grain is one row per episode_id.
select
    episode_id,
    count(*) as row_count
from herding_episodes
group by episode_id
having count(*) > 1 or episode_id is null
