//! Time intervals `[start, end)` in nanoseconds, as the step-time split and timeline.png's
//! exposed bands both need them: one set of rules, so the picture's bands are the report's
//! figures drawn where they happen.

/// Disjoint, sorted intervals covering what `v` covers (empty intervals dropped).
pub fn merged(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|x| x.1 > x.0);
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Nanoseconds covered by at least one of the intervals.
pub fn union_len(v: &[(u64, u64)]) -> u64 {
    merged(v.to_vec()).iter().map(|(s, e)| e - s).sum()
}

/// The parts of `a` inside `b`; both disjoint and sorted ([`merged`]).
pub fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            let (x, y) = (s.max(b[k].0), e.min(b[k].1));
            if y > x {
                out.push((x, y));
            }
            k += 1;
        }
    }
    out
}

/// The parts of `a` outside `b`; both disjoint and sorted ([`merged`]).
pub fn minus(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut cur = s;
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > cur {
                out.push((cur, b[k].0));
            }
            cur = cur.max(b[k].1);
            k += 1;
        }
        if cur < e {
            out.push((cur, e));
        }
    }
    out
}

/// Nanoseconds of the union of `a` not covered by the union of `b`.
pub fn uncovered(a: &[(u64, u64)], b: &[(u64, u64)]) -> u64 {
    minus(&merged(a.to_vec()), &merged(b.to_vec())).iter().map(|(s, e)| e - s).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposed_time_is_the_part_of_comm_not_under_compute() {
        // comm [0,10) [20,30); compute [5,25): exposed = 5 + 5.
        assert_eq!(uncovered(&[(0, 10), (20, 30)], &[(5, 25)]), 10);
        assert_eq!(uncovered(&[(0, 10)], &[]), 10);
        assert_eq!(uncovered(&[(2, 4)], &[(0, 3), (3, 10)]), 0);
        // Overlapping comm intervals count once.
        assert_eq!(uncovered(&[(0, 10), (5, 15)], &[(12, 20)]), 12);
        assert_eq!(minus(&[(0, 10), (20, 30)], &[(5, 25)]), vec![(0, 5), (25, 30)]);
        assert_eq!(intersect(&[(0, 10), (20, 30)], &[(5, 25)]), vec![(5, 10), (20, 25)]);
        assert_eq!(union_len(&[(0, 10), (5, 15), (20, 20)]), 15);
    }
}
