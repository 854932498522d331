//! Which `SECKILL_*` environment variables a service accepts: a misspelt one stops it at
//! start, naming the variable and the closest known one, instead of leaving the setting on
//! its default without a word.
//!
//! For the service whose own prefix is `SECKILL_<OWN>_`, a variable is accepted when
//! - it is `SECKILL_<key>` and `<key>` is a setting of any service (one environment may be
//!   shared by all three, as `docker-compose.yml`'s anchors and `scripts/up.sh` do), or
//! - it is `SECKILL_<OWN>_<key>` and `<key>` is a setting of this service, or
//! - it is aimed at another service (`SECKILL_<OTHER>_…`): that service checks it, or
//! - the loader reads it itself ([`LOADER_VARIABLES`]), or tools and tests do
//!   ([`TOOL_VARIABLES`], [`TOOL_PREFIXES`]): the load tester's, the test suite's.
//!
//! Every service's keys come from [`crate::known::SETTINGS`], generated from the three
//! settings types together with `docs/configuration.md` (see that file's header).

use std::collections::BTreeSet;
use std::fmt;

/// Every variable name starts with this.
pub const PREFIX: &str = "SECKILL_";

/// Variables the loader names itself ([`crate::load`]): the settings file, and `SECKILL_LOG`,
/// which it skips rather than read as a setting.
pub const LOADER_VARIABLES: &[&str] = &["SECKILL_CONFIG", "SECKILL_LOG"];

/// Variables read by the tools beside the services, not by a service: a shell that runs
/// both may hold them. The load tester's target (`scripts/demo.sh` exports it), how long
/// `scripts/up.sh` waits, the schemathesis test's seed.
pub const TOOL_VARIABLES: &[&str] = &[
    "SECKILL_GATEWAY_URL",
    "SECKILL_UP_TIMEOUT",
    "SECKILL_SCHEMATHESIS_SEED",
];

/// Families of variables read by tools and tests, never by a service: the test suite's
/// servers and switches (`SECKILL_TEST_REDIS`, …), regeneration of the generated files
/// (`SECKILL_UPDATE_OPENAPI`, …), the load tester's options, `scripts/compose-smoke.sh`'s
/// and `scripts/fuzz.sh`'s.
pub const TOOL_PREFIXES: &[&str] = &[
    "SECKILL_TEST_",
    "SECKILL_UPDATE_",
    "SECKILL_LOADTEST_",
    "SECKILL_SMOKE_",
    "SECKILL_FUZZ_",
];

/// A variable no setting reads, with the known name closest to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariable {
    /// The variable as it was set.
    pub name: String,
    /// The accepted name fewest edits away, if any is close enough to be a likely typo.
    pub closest: Option<String>,
}

impl fmt::Display for UnknownVariable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown setting {}", self.name)?;
        match &self.closest {
            Some(closest) => write!(f, "; did you mean {closest}?"),
            None => f.write_str(" (docs/configuration.md lists the settings)"),
        }
    }
}

/// The `SECKILL_*` variables among `names` that the service with own prefix `own_prefix`
/// (`"gateway"`, `"api"`, `"order"`) and settings keys `own_keys` would not read, in the
/// order given. `all_keys` are the keys of every service ([`all_keys`] in production).
pub fn unknown_variables<'a>(
    names: impl IntoIterator<Item = &'a str>,
    own_prefix: &str,
    own_keys: &BTreeSet<String>,
    all_keys: &BTreeSet<String>,
) -> Vec<UnknownVariable> {
    let own = service_prefix(own_prefix);
    let others: Vec<String> = crate::known::SETTINGS
        .iter()
        .map(|(prefix, _)| service_prefix(prefix))
        .filter(|prefix| *prefix != own)
        .collect();
    let accepted = |upper: &str| -> bool {
        let Some(rest) = upper.strip_prefix(PREFIX) else {
            return true;
        };
        LOADER_VARIABLES.contains(&upper)
            || TOOL_VARIABLES.contains(&upper)
            || TOOL_PREFIXES.iter().any(|p| upper.starts_with(p))
            || all_keys.contains(&rest.to_ascii_lowercase())
            || upper
                .strip_prefix(own.as_str())
                .is_some_and(|key| own_keys.contains(&key.to_ascii_lowercase()))
            || others.iter().any(|other| upper.starts_with(other.as_str()))
    };
    let mut candidates: Option<Vec<String>> = None;
    names
        .into_iter()
        .filter(|name| !accepted(&name.to_ascii_uppercase()))
        .map(|name| {
            let candidates = candidates.get_or_insert_with(|| {
                let mut names: Vec<String> = LOADER_VARIABLES
                    .iter()
                    .map(|v| v.to_string())
                    .chain(all_keys.iter().map(|k| variable(PREFIX, k)))
                    .chain(own_keys.iter().map(|k| variable(&own, k)))
                    .collect();
                names.sort();
                names.dedup();
                names
            });
            UnknownVariable {
                name: name.to_string(),
                closest: closest(&name.to_ascii_uppercase(), candidates),
            }
        })
        .collect()
}

/// The settings keys of every service, from [`crate::known::SETTINGS`].
pub fn all_keys() -> BTreeSet<String> {
    crate::known::SETTINGS
        .iter()
        .flat_map(|(_, keys)| keys.iter().map(|k| k.to_string()))
        .collect()
}

/// `SECKILL_<PREFIX>_` for a service prefix such as `order`.
pub fn service_prefix(prefix: &str) -> String {
    format!("{PREFIX}{}_", prefix.to_ascii_uppercase())
}

/// The variable that sets `key` under `prefix` (`SECKILL_` or a service's own).
pub fn variable(prefix: &str, key: &str) -> String {
    format!("{prefix}{}", key.to_ascii_uppercase())
}

/// The candidate fewest edits from `name`, when the edits are few next to its length (at
/// most a third of the name after `SECKILL_`, and at least one allowed); the first in
/// order on a tie.
fn closest(name: &str, candidates: &[String]) -> Option<String> {
    let limit = (name.len().saturating_sub(PREFIX.len()) / 3).max(1);
    candidates
        .iter()
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate.clone())
}

/// Levenshtein distance: single-character insertions, deletions and substitutions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// order-service's view: its own keys, and every service's.
    fn unknown(names: &[&str]) -> Vec<UnknownVariable> {
        let own = keys(&["port", "batch_linger_ms", "namespace", "order_signing_key"]);
        let all = keys(&[
            "port",
            "batch_linger_ms",
            "namespace",
            "order_signing_key",
            "jwt_secret",
            "order_service_urls",
        ]);
        unknown_variables(names.iter().copied(), "order", &own, &all)
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("LINGER", "LINGER"), 0);
        assert_eq!(edit_distance("LINGR", "LINGER"), 1);
        assert_eq!(edit_distance("LINGEER", "LINGER"), 1);
        assert_eq!(edit_distance("LINGAR", "LINGER"), 1);
        assert_eq!(edit_distance("", "ABC"), 3);
        assert_eq!(edit_distance("KITTEN", "SITTING"), 3);
    }

    #[test]
    fn a_misspelt_own_variable_is_refused_naming_the_closest_one() {
        let found = unknown(&["SECKILL_ORDER_BATCH_LINGR_MS"]);
        assert_eq!(
            found,
            [UnknownVariable {
                name: "SECKILL_ORDER_BATCH_LINGR_MS".into(),
                closest: Some("SECKILL_ORDER_BATCH_LINGER_MS".into()),
            }]
        );
        assert_eq!(
            found[0].to_string(),
            "unknown setting SECKILL_ORDER_BATCH_LINGR_MS; \
             did you mean SECKILL_ORDER_BATCH_LINGER_MS?"
        );
    }

    #[test]
    fn a_misspelt_shared_variable_is_refused_naming_the_closest_one() {
        let found = unknown(&["SECKILL_NAMESPAC"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].closest.as_deref(), Some("SECKILL_NAMESPACE"));
    }

    #[test]
    fn a_name_far_from_every_setting_is_refused_without_a_guess() {
        let found = unknown(&["SECKILL_COMPLETELY_DIFFERENT"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].closest, None);
        assert!(
            found[0].to_string().contains("docs/configuration.md"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn own_and_shared_forms_of_known_settings_are_accepted() {
        assert_eq!(
            unknown(&[
                "SECKILL_ORDER_PORT",
                "SECKILL_PORT",
                "SECKILL_NAMESPACE",
                "SECKILL_ORDER_NAMESPACE",
                // The shared key `order_signing_key`, though it starts with the own prefix.
                "SECKILL_ORDER_SIGNING_KEY",
            ]),
            []
        );
    }

    #[test]
    fn another_services_setting_is_accepted_unprefixed_but_not_under_the_own_prefix() {
        assert_eq!(unknown(&["SECKILL_JWT_SECRET"]), []);
        let found = unknown(&["SECKILL_ORDER_JWT_SECRET"]);
        assert_eq!(found.len(), 1, "order-service has no jwt_secret of its own");
    }

    #[test]
    fn variables_aimed_at_another_service_are_left_to_it() {
        assert_eq!(
            unknown(&["SECKILL_GATEWAY_PORTT", "SECKILL_API_ANYTHING"]),
            []
        );
    }

    #[test]
    fn the_loaders_tools_and_tests_variables_are_accepted() {
        assert_eq!(
            unknown(&[
                "SECKILL_CONFIG",
                "SECKILL_LOG",
                "SECKILL_GATEWAY_URL",
                "SECKILL_UP_TIMEOUT",
                "SECKILL_TEST_REDIS_CLUSTER",
                "SECKILL_UPDATE_OPENAPI",
                "SECKILL_LOADTEST_USERS",
            ]),
            []
        );
    }

    #[test]
    fn names_are_matched_whatever_their_case_as_the_loader_reads_them() {
        assert_eq!(unknown(&["seckill_order_batch_linger_ms"]), []);
        let found = unknown(&["seckill_order_batch_lingr_ms"]);
        assert_eq!(found[0].name, "seckill_order_batch_lingr_ms");
        assert_eq!(
            found[0].closest.as_deref(),
            Some("SECKILL_ORDER_BATCH_LINGER_MS")
        );
    }

    #[test]
    fn variables_outside_the_family_are_none_of_its_business() {
        assert_eq!(unknown(&["PATH", "RUST_LOG", "SECKILLX"]), []);
    }

    #[test]
    fn every_unknown_variable_is_reported_in_the_order_given() {
        let found = unknown(&["SECKILL_ORDER_PORTT", "SECKILL_PORT", "SECKILL_NAMESPAC"]);
        let names: Vec<&str> = found.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["SECKILL_ORDER_PORTT", "SECKILL_NAMESPAC"]);
    }
}
