//! Where standby replicas go in a consumer group (`task.standby_replicas
//! = N`): each partition's standbys are kept by the N members that follow
//! its owner in member-id order. Every member reads the same group
//! description (DescribeGroups: each member's id and assignment), so each
//! computes the same placement on its own, with no coordination beyond
//! the group's. librdkafka offers no custom assignor, so the assignment
//! itself stays `cooperative-sticky`'s: a partition that moves lands on a
//! standby when its new owner is one of those N (always, with N = members
//! less one).

use std::collections::{BTreeMap, BTreeSet};

/// The partitions of `topic` in a member's assignment, as the consumer
/// protocol encodes it (version, then per topic: name, partitions; user
/// data after). None when the bytes are not that.
pub(super) fn assigned_partitions(bytes: &[u8], topic: &str) -> Option<Vec<i32>> {
    let mut r = Reader(bytes);
    let _version = r.i16()?;
    let mut found = Vec::new();
    for _ in 0..r.count()? {
        let name = r.string()?;
        let n = r.count()?;
        for _ in 0..n {
            let p = r.i32()?;
            if name == topic.as_bytes() {
                found.push(p);
            }
        }
    }
    Some(found)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes: &'a [u8] = self.0;
        let (head, rest) = (bytes.get(..n)?, bytes.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    /// An array length: never negative here, and bounded by the bytes
    /// left (each element takes at least 2 bytes), so a corrupt length
    /// cannot make the caller loop for long.
    fn count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.i32()?).ok()?;
        (n <= self.0.len() / 2).then_some(n)
    }
    fn string(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.i16()?).ok()?;
        self.take(n)
    }
}

/// The partitions `me` keeps standbys of: for each owned partition, the
/// `replicas` members after its owner in member-id order (never the
/// owner itself).
pub(super) fn standbys_of(
    me: &str,
    members: &BTreeMap<String, Vec<i32>>,
    replicas: usize,
) -> BTreeSet<i32> {
    let ids: Vec<&String> = members.keys().collect();
    let Some(mine) = ids.iter().position(|id| id.as_str() == me) else {
        return BTreeSet::new();
    };
    let replicas = replicas.min(ids.len().saturating_sub(1));
    let mut kept = BTreeSet::new();
    for (owner, partitions) in members.values().enumerate() {
        let keepers = (1..=replicas).map(|k| (owner + k) % ids.len());
        if keepers.clone().any(|k| k == mine) {
            kept.extend(partitions.iter().copied());
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The consumer protocol's assignment: version 1, one topic per entry.
    fn encode(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = 1i16.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (name, partitions) in topics {
            b.extend((name.len() as i16).to_be_bytes());
            b.extend(name.as_bytes());
            b.extend((partitions.len() as i32).to_be_bytes());
            for p in *partitions {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend(0i32.to_be_bytes()); // no user data
        b
    }

    #[test]
    fn an_assignment_decodes_to_its_topic_s_partitions() {
        let bytes = encode(&[("other", &[9]), ("in", &[3, 0])]);
        assert_eq!(assigned_partitions(&bytes, "in"), Some(vec![3, 0]));
        assert_eq!(assigned_partitions(&bytes, "none"), Some(vec![]));
        // What librdkafka's rebalancing sends (seen on the test broker).
        let seen =
            b"\x00\x00\x00\x00\x00\x01\x00\x03fx1\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00";
        assert_eq!(assigned_partitions(seen, "fx1"), Some(vec![1]));
        assert_eq!(assigned_partitions(b"", "in"), None);
        assert_eq!(assigned_partitions(&bytes[..bytes.len() - 9], "in"), None);
        // A huge count is refused, not looped over.
        let mut lie = 0i16.to_be_bytes().to_vec();
        lie.extend(i32::MAX.to_be_bytes());
        assert_eq!(assigned_partitions(&lie, "in"), None);
    }

    #[test]
    fn each_partition_s_standbys_follow_its_owner() {
        let members: BTreeMap<String, Vec<i32>> = [
            ("a".to_string(), vec![0, 1]),
            ("b".to_string(), vec![2, 3]),
            ("c".to_string(), vec![4, 5]),
        ]
        .into();
        let kept = |me: &str, n| standbys_of(me, &members, n).into_iter().collect::<Vec<_>>();
        assert_eq!(kept("a", 1), [4, 5]);
        assert_eq!(kept("b", 1), [0, 1]);
        assert_eq!(kept("c", 1), [2, 3]);
        // More replicas than other members: every other member's partitions.
        assert_eq!(kept("a", 2), [2, 3, 4, 5]);
        assert_eq!(kept("a", 9), [2, 3, 4, 5]);
        assert_eq!(kept("a", 0), [] as [i32; 0]);
        // Not (or no longer) a member: none.
        assert_eq!(kept("z", 2), [] as [i32; 0]);
        // Every partition has exactly min(n, members - 1) keepers.
        for n in 0..4 {
            for p in 0..6 {
                let keepers = ["a", "b", "c"]
                    .iter()
                    .filter(|m| standbys_of(m, &members, n).contains(&p))
                    .count();
                assert_eq!(keepers, n.min(2), "partition {p} with {n} replicas");
            }
        }
    }
}
