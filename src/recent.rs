//! A thread's last few answers, the most recently used last. A sweep's neighbouring
//! configurations share the DAG (the model and micro-batch shape) and its checkpointing
//! decisions; building either per configuration was a tenth and a twentieth of a sweep
//! (`sweep::summary`, `schedule::checkpoint::plan`). Imports nothing from the crate.

/// The answer `cache` holds for the key `matches` picks, made the most recent; else
/// `make`'s (key, answer), kept in place of the least recently used once `cache` holds
/// `capacity`.
pub fn recall<K, V: Clone>(
    cache: &mut Vec<(K, V)>,
    capacity: usize,
    matches: impl Fn(&K) -> bool,
    make: impl FnOnce() -> (K, V),
) -> V {
    if let Some(i) = cache.iter().position(|(k, _)| matches(k)) {
        let hit = cache.remove(i);
        let answer = hit.1.clone();
        cache.push(hit);
        return answer;
    }
    let (key, answer) = make();
    if cache.len() >= capacity {
        cache.remove(0);
    }
    cache.push((key, answer.clone()));
    answer
}

#[cfg(test)]
mod tests {
    use super::recall;

    #[test]
    fn keeps_the_most_recent_and_drops_the_least() {
        let mut c: Vec<(u32, u32)> = Vec::new();
        let mut made = 0;
        let mut get = |c: &mut Vec<(u32, u32)>, k: u32| {
            recall(
                c,
                2,
                |&x| x == k,
                || {
                    made += 1;
                    (k, k * 10)
                },
            )
        };
        assert_eq!(get(&mut c, 1), 10);
        assert_eq!(get(&mut c, 2), 20);
        assert_eq!(get(&mut c, 1), 10); // a hit: 1 becomes the most recent
        assert_eq!(get(&mut c, 3), 30); // drops 2, the least recent
        assert_eq!(c.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(get(&mut c, 2), 20);
        assert_eq!(made, 4);
    }
}
