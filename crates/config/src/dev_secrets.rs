//! The refusal to run on a public development secret.
//!
//! The development values of the secrets are public (in this repository's source and its
//! configuration reference), so a service running on one trusts anybody who read them: with the
//! identity key, a forged admin identity reaches a backend directly. Every service therefore
//! checks its secrets where its binary loads the settings (not in `load`, so tests that build
//! settings by hand stay as they are) and stops unless the operator opted into development mode
//! with [`ALLOW_DEV_SECRETS_VARIABLE`].

use crate::{ConfigError, Secret};

/// The switch that lets a service run on public development secrets (a typed `bool` field,
/// `allow_dev_secrets`, of every service's settings).
pub const ALLOW_DEV_SECRETS_VARIABLE: &str = "SECKILL_ALLOW_DEV_SECRETS";

/// One secret to check: the variable that sets it (named in the refusal), its value, and the
/// public development value it must not have.
pub type SecretCheck<'a> = (&'a str, &'a Secret, &'a str);

/// Refuses any secret equal to its public development value, naming each variable, unless
/// `allow_dev_secrets`; then returns those variables so the caller can warn about them.
pub fn refuse_public_secrets<'a>(
    secrets: &[SecretCheck<'a>],
    allow_dev_secrets: bool,
) -> Result<Vec<&'a str>, ConfigError> {
    let public: Vec<&str> = secrets
        .iter()
        .filter(|(_, value, public)| value.expose() == *public)
        .map(|(variable, _, _)| *variable)
        .collect();
    if public.is_empty() || allow_dev_secrets {
        return Ok(public);
    }
    let (names, what) = match public.as_slice() {
        [one] => (one.to_string(), "is the public development default"),
        many => (many.join(", "), "are public development defaults"),
    };
    Err(ConfigError::PublicSecret(format!(
        "{names} {what}; set a secret of your own, or {ALLOW_DEV_SECRETS_VARIABLE}=true to run \
         on it anyway (development only)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLIC_A: &str = "public-a";
    const PUBLIC_B: &str = "public-b";

    #[test]
    fn a_public_secret_is_refused_by_its_variable_name() {
        let a = Secret::new(PUBLIC_A);
        let b = Secret::new("private");
        let error = refuse_public_secrets(
            &[("SECKILL_A", &a, PUBLIC_A), ("SECKILL_B", &b, PUBLIC_B)],
            false,
        )
        .expect_err("a public secret is refused")
        .to_string();
        assert!(
            error.starts_with("SECKILL_A is the public development default"),
            "{error}"
        );
        assert!(error.contains("SECKILL_ALLOW_DEV_SECRETS=true"), "{error}");
        assert!(!error.contains("SECKILL_B"), "{error}");
    }

    #[test]
    fn every_public_secret_is_named_at_once() {
        let a = Secret::new(PUBLIC_A);
        let b = Secret::new(PUBLIC_B);
        let error = refuse_public_secrets(
            &[("SECKILL_A", &a, PUBLIC_A), ("SECKILL_B", &b, PUBLIC_B)],
            false,
        )
        .expect_err("refused")
        .to_string();
        assert!(
            error.starts_with("SECKILL_A, SECKILL_B are public development defaults"),
            "{error}"
        );
    }

    #[test]
    fn the_switch_lets_public_secrets_through_and_names_them() {
        let a = Secret::new(PUBLIC_A);
        let b = Secret::new("private");
        let checks = [("SECKILL_A", &a, PUBLIC_A), ("SECKILL_B", &b, PUBLIC_B)];
        assert_eq!(
            refuse_public_secrets(&checks, true).expect("allowed"),
            vec!["SECKILL_A"]
        );
    }

    #[test]
    fn private_secrets_pass_without_the_switch() {
        let a = Secret::new("private-a");
        assert_eq!(
            refuse_public_secrets(&[("SECKILL_A", &a, PUBLIC_A)], false).expect("private"),
            Vec::<&str>::new()
        );
    }
}
