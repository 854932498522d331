//! How settings are written, and read into types once, at start.
//!
//! The variable names stay what operators know (`SECKILL_ORDER_BATCH_LINGER_MS=5`); the
//! fields hold what the code uses (`Duration`, `Vec<…>`, enums). Each module below is a serde
//! adapter for `#[serde(with = "…")]`: a bad value fails [`crate::load`] with figment's error,
//! which names the key and the variable (or file) it came from.
//!
//! - [`millis`] / [`secs`]: a `Duration` written as whole milliseconds / seconds.
//! - [`millis_list`]: a `Vec<Duration>` written as comma-separated milliseconds
//!   (`"1000,5000,30000"`), or as a TOML array.
//! - [`list`]: a `Vec<String>` written comma-separated (blanks dropped), or as a TOML array.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;

/// A `Duration` as whole milliseconds.
pub mod millis {
    use super::*;

    /// Writes the duration as milliseconds.
    pub fn serialize<S: Serializer>(value: &Duration, out: S) -> Result<S::Ok, S::Error> {
        out.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads a non-negative whole number of milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Duration, D::Error> {
        input
            .deserialize_any(Whole("milliseconds"))
            .map(Duration::from_millis)
    }
}

/// A `Duration` as whole seconds.
pub mod secs {
    use super::*;

    /// Writes the duration as seconds.
    pub fn serialize<S: Serializer>(value: &Duration, out: S) -> Result<S::Ok, S::Error> {
        out.serialize_u64(value.as_secs())
    }

    /// Reads a non-negative whole number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Duration, D::Error> {
        input
            .deserialize_any(Whole("seconds"))
            .map(Duration::from_secs)
    }
}

/// A list of `Duration`s as comma-separated milliseconds.
pub mod millis_list {
    use super::*;

    /// Writes `"1000,5000"`.
    pub fn serialize<S: Serializer>(value: &[Duration], out: S) -> Result<S::Ok, S::Error> {
        let text: Vec<String> = value.iter().map(|d| d.as_millis().to_string()).collect();
        out.serialize_str(&text.join(","))
    }

    /// Reads `"1000,5000"`, a single number, or an array of numbers.
    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Vec<Duration>, D::Error> {
        let items: Vec<String> = input.deserialize_any(Items)?;
        items
            .iter()
            .map(|item| {
                item.parse::<u64>().map(Duration::from_millis).map_err(|_| {
                    de::Error::custom(format!(
                        "{item:?} is not a whole number of milliseconds \
                         (expected a comma-separated list such as 1000,5000)"
                    ))
                })
            })
            .collect()
    }
}

/// A list of strings, comma-separated.
pub mod list {
    use super::*;

    /// Writes `"a,b"`.
    pub fn serialize<S: Serializer>(value: &[String], out: S) -> Result<S::Ok, S::Error> {
        out.serialize_str(&value.join(","))
    }

    /// Reads `"a, b"` (blanks dropped) or an array of strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Vec<String>, D::Error> {
        input.deserialize_any(Items)
    }
}

/// Accepts a whole non-negative number, from an integer or from text holding one (a TOML
/// file may quote it); names the unit in its error.
struct Whole(&'static str);

impl Visitor<'_> for Whole {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole, non-negative number of {}", self.0)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        v.trim()
            .parse()
            .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

/// Accepts comma-separated text, a lone scalar, or a sequence, as a list of item texts.
struct Items;

impl<'de> Visitor<'de> for Items {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a comma-separated list or an array")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(crate::split_list(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(vec![v.to_string()])
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(vec![v.to_string()])
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Scalar>()? {
            items.push(item.0);
        }
        Ok(items)
    }
}

/// One array element: text or a number, kept as text.
struct Scalar(String);

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(input: D) -> Result<Self, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("text or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
                Ok(v.trim().to_string())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
                Ok(v.to_string())
            }
        }
        input.deserialize_any(Text).map(Scalar)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use figment::Figment;
    use figment::providers::{Format, Serialized, Toml};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(default)]
    struct Typed {
        #[serde(with = "super::millis")]
        linger_ms: Duration,
        #[serde(with = "super::secs")]
        window_secs: Duration,
        #[serde(with = "super::millis_list")]
        tiers_ms: Vec<Duration>,
        #[serde(with = "super::list")]
        urls: Vec<String>,
    }

    impl Default for Typed {
        fn default() -> Self {
            Self {
                linger_ms: Duration::from_millis(5),
                window_secs: Duration::from_secs(900),
                tiers_ms: vec![Duration::from_millis(1000), Duration::from_millis(5000)],
                urls: vec!["http://a".into()],
            }
        }
    }

    fn read(key: &str, value: impl Serialize) -> Result<Typed, Box<figment::Error>> {
        Figment::from(Serialized::defaults(Typed::default()))
            .merge(Serialized::default(key, value))
            .extract()
            .map_err(Box::new)
    }

    #[test]
    fn defaults_round_trip_through_their_written_form() {
        let typed: Typed = Figment::from(Serialized::defaults(Typed::default()))
            .extract()
            .expect("defaults");
        assert_eq!(typed.linger_ms, Duration::from_millis(5));
        assert_eq!(typed.window_secs, Duration::from_secs(900));
        assert_eq!(typed.tiers_ms.len(), 2);
        assert_eq!(typed.urls, vec!["http://a".to_string()]);
    }

    #[test]
    fn durations_read_whole_numbers_in_their_unit() {
        assert_eq!(read("linger_ms", 250).unwrap().linger_ms.as_millis(), 250);
        assert_eq!(read("window_secs", 3).unwrap().window_secs.as_secs(), 3);
        assert_eq!(read("linger_ms", "40").unwrap().linger_ms.as_millis(), 40);
    }

    #[test]
    fn a_bad_duration_is_refused_with_the_key_named() {
        for bad in [
            read("linger_ms", -1).unwrap_err(),
            read("linger_ms", "soon").unwrap_err(),
        ] {
            let text = bad.to_string();
            assert!(text.contains("linger_ms"), "{text}");
            assert!(text.contains("milliseconds"), "{text}");
        }
    }

    #[test]
    fn lists_read_comma_separated_text_a_lone_value_or_an_array() {
        let tiers = |t: Typed| t.tiers_ms.iter().map(|d| d.as_millis()).collect::<Vec<_>>();
        assert_eq!(tiers(read("tiers_ms", "10, 20,,30").unwrap()), [10, 20, 30]);
        assert_eq!(tiers(read("tiers_ms", 7).unwrap()), [7]);
        let file = Figment::from(Serialized::defaults(Typed::default()))
            .merge(Toml::string("tiers_ms = [1, 2]\nurls = [\"x\", \"y\"]"))
            .extract::<Typed>()
            .expect("arrays");
        assert_eq!(tiers(file), [1, 2]);
        let urls = read("urls", " http://a:1 , http://b:2 ").unwrap().urls;
        assert_eq!(urls, ["http://a:1", "http://b:2"]);
    }

    #[test]
    fn a_list_item_that_is_no_number_is_refused_with_the_key_named() {
        let text = read("tiers_ms", "1000,5s").unwrap_err().to_string();
        assert!(
            text.contains("tiers_ms") && text.contains("\"5s\""),
            "{text}"
        );
    }
}
