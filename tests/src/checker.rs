//! Loss and duplicate checks: compare what was produced with what a consumer delivered.

use std::collections::{BTreeMap, BTreeSet};

/// A record's place in Kafka.
pub type Coordinates = (String, i32, i64);

/// The verdict of comparing expected records with delivered ones.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeliveryReport {
    /// Expected but never delivered.
    pub missing: Vec<Coordinates>,
    /// Delivered more than once, with the count.
    pub duplicated: Vec<(Coordinates, usize)>,
    /// Delivered but never expected.
    pub unexpected: Vec<Coordinates>,
}

impl DeliveryReport {
    pub fn compare(
        expected: impl IntoIterator<Item = Coordinates>,
        delivered: impl IntoIterator<Item = Coordinates>,
    ) -> DeliveryReport {
        let expected: BTreeSet<Coordinates> = expected.into_iter().collect();
        let mut counts: BTreeMap<Coordinates, usize> = BTreeMap::new();
        for c in delivered {
            *counts.entry(c).or_default() += 1;
        }
        DeliveryReport {
            missing: expected
                .iter()
                .filter(|c| !counts.contains_key(*c))
                .cloned()
                .collect(),
            duplicated: counts
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(c, n)| (c.clone(), *n))
                .collect(),
            unexpected: counts
                .keys()
                .filter(|c| !expected.contains(*c))
                .cloned()
                .collect(),
        }
    }

    /// Every expected record delivered at least once, nothing unexpected.
    pub fn nothing_lost(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty()
    }

    /// Every expected record delivered exactly once, nothing unexpected.
    pub fn exactly_once(&self) -> bool {
        self.nothing_lost() && self.duplicated.is_empty()
    }

    /// A short description for assertion messages.
    pub fn summary(&self) -> String {
        format!(
            "{} missing (first: {:?}), {} duplicated (first: {:?}), {} unexpected (first: {:?})",
            self.missing.len(),
            self.missing.first(),
            self.duplicated.len(),
            self.duplicated.first(),
            self.unexpected.len(),
            self.unexpected.first()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(p: i32, o: i64) -> Coordinates {
        ("t".to_string(), p, o)
    }

    #[test]
    fn report_names_missing_duplicated_and_unexpected_records() {
        let report = DeliveryReport::compare(
            vec![c(0, 0), c(0, 1), c(1, 0)],
            vec![c(0, 0), c(0, 0), c(1, 0), c(2, 9)],
        );
        assert_eq!(report.missing, vec![c(0, 1)]);
        assert_eq!(report.duplicated, vec![(c(0, 0), 2)]);
        assert_eq!(report.unexpected, vec![c(2, 9)]);
        assert!(!report.nothing_lost());
    }

    #[test]
    fn duplicates_alone_still_count_as_nothing_lost() {
        let report = DeliveryReport::compare(vec![c(0, 0)], vec![c(0, 0), c(0, 0)]);
        assert!(report.nothing_lost());
        assert!(!report.exactly_once());
    }
}
