//! How a span's fields are kept for the JSON log lines: as the JSON object the lines embed
//! (`"span"`, `"spans"`), written straight into one string.
//!
//! `tracing_subscriber`'s `JsonFields` does the same through a map of `serde_json` values (an
//! allocation per field) and, for every field recorded after the span was made (the gateway
//! records `trace_id` and `user_id`), parses the object back into a map and writes it again.
//! That is paid by every request span, whether or not a line is ever emitted inside it, and
//! it was the larger part of what a span cost a request at the default `info` filter.
//! [`SpanFields`] writes the object once (into a scratch string of the thread, then copied
//! in one piece) and adds a later field by appending it: a span costs a string of its fields, and a line emitted inside it reads the same object as
//! before (a field recorded twice keeps its last value, as with `JsonFields`).

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::span::Record;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::Writer;

/// The [`FormatFields`] of the JSON span fields: a JSON object, appended to in place.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanFields;

thread_local! {
    /// Where a new span's object is written before it is copied into the span's own string in
    /// one piece: written there piece by piece, that string would be reallocated as it grows.
    static SCRATCH: RefCell<String> = RefCell::new(String::with_capacity(256));
}

/// Writes the object of `fields` into `out`.
fn write_object<W: fmt::Write>(out: &mut W, fields: impl RecordFields) -> fmt::Result {
    out.write_char('{')?;
    let mut object = Object::new(&mut *out, false);
    fields.record(&mut object);
    object.finish()?;
    out.write_char('}')
}

impl<'writer> FormatFields<'writer> for SpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => {
                scratch.clear();
                write_object(&mut *scratch, fields)?;
                let written = writer.write_str(&scratch);
                if scratch.capacity() > 4096 {
                    // An outsized span's fields: not kept for the thread's life.
                    *scratch = String::with_capacity(256);
                }
                written
            }
            // A field's own formatting made a span on this thread: written directly.
            Err(_) => write_object(&mut writer, fields),
        })
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &Record<'_>,
    ) -> fmt::Result {
        if fields.is_empty() {
            return Ok(());
        }
        let text = &mut current.fields;
        // "{...}" as written by `format_fields`; anything else is started again.
        if !(text.starts_with('{') && text.ends_with('}')) {
            text.clear();
            text.push('{');
        } else {
            text.pop();
        }
        let any = text.len() > 1;
        let mut object = Object::new(text, any);
        fields.record(&mut object);
        object.finish()?;
        text.push('}');
        Ok(())
    }
}

/// Adds `"key":"value"` (`value` escaped) to the JSON object `text` holds (`"{...}"`), as a
/// field recorded on a span would be ([`crate::request_scope`] keeps its fields this way).
pub(crate) fn push_str(text: &mut String, key: &str, value: &str) {
    push_entry(text, key, |out| {
        out.push('"');
        // Writing into a String cannot fail.
        let _ = Escaped(&mut *out).write_str(value);
        out.push('"');
    });
}

/// Adds `"key":value` for a number to the JSON object `text` holds.
pub(crate) fn push_number(text: &mut String, key: &str, value: impl fmt::Display) {
    push_entry(text, key, |out| {
        let _ = write!(out, "{value}");
    });
}

fn push_entry(text: &mut String, key: &str, value: impl FnOnce(&mut String)) {
    if text.ends_with('}') {
        text.pop();
    } else {
        text.clear();
        text.push('{');
    }
    if text.len() > 1 {
        text.push(',');
    }
    text.push('"');
    let _ = Escaped(&mut *text).write_str(key);
    text.push_str("\":");
    value(text);
    text.push('}');
}

/// Writes `"name":value` entries, comma-separated, into `out`; the first error sticks.
struct Object<'a, W: fmt::Write> {
    out: &'a mut W,
    any: bool,
    result: fmt::Result,
}

impl<'a, W: fmt::Write> Object<'a, W> {
    fn new(out: &'a mut W, any: bool) -> Self {
        Self {
            out,
            any,
            result: Ok(()),
        }
    }

    fn finish(self) -> fmt::Result {
        self.result
    }

    /// Writes the key of `field` (`r#type` as `type`) and the colon.
    fn key(&mut self, field: &Field) -> fmt::Result {
        if self.any {
            self.out.write_char(',')?;
        }
        self.any = true;
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.out.write_char('"')?;
        Escaped(&mut *self.out).write_str(name)?;
        self.out.write_str("\":")
    }

    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = self.key(field).and_then(|()| value(self.out));
    }

    fn string(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        self.entry(field, |out| {
            out.write_char('"')?;
            Escaped(&mut *out).write_fmt(value)?;
            out.write_char('"')
        });
    }
}

impl<W: fmt::Write> Visit for Object<'_, W> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: `JsonFields` writes those as null too.
        if value.is_finite() {
            // `{:?}` keeps the fraction (`1.0`), as serde_json writes it.
            self.entry(field, |out| write!(out, "{value:?}"));
        } else {
            self.entry(field, |out| out.write_str("null"));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |out| write!(out, "{value}"));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.entry(field, |out| write!(out, "{value}"));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.entry(field, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |out| write!(out, "{value}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.string(field, format_args!("{value}"));
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        // As `JsonFields` (serde_json) writes bytes: an array of numbers.
        self.entry(field, |out| {
            out.write_char('[')?;
            for (i, byte) in value.iter().enumerate() {
                if i > 0 {
                    out.write_char(',')?;
                }
                write!(out, "{byte}")?;
            }
            out.write_char(']')
        });
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.string(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // Fields of `log` records, already written by the event format.
        if field.name().starts_with("log.") {
            return;
        }
        self.string(field, format_args!("{value:?}"));
    }
}

/// Writes what it is given as the inside of a JSON string.
struct Escaped<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, byte) in s.bytes().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = i + 1;
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tracing_subscriber::fmt::format::JsonFields;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Debug)]
    struct Oops;

    impl fmt::Display for Oops {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("it \"broke\"\n\tbadly \u{1} \\ ü")
        }
    }

    impl std::error::Error for Oops {}

    /// The JSON object each formatter keeps for a span made and recorded by `make`.
    fn both(make: impl Fn() -> tracing::Span) -> (serde_json::Value, serde_json::Value) {
        fn fields<N>(span: &tracing::Span) -> String
        where
            N: for<'w> FormatFields<'w> + 'static,
        {
            span.with_subscriber(|(id, dispatch)| {
                let registry = dispatch
                    .downcast_ref::<tracing_subscriber::Registry>()
                    .expect("a registry");
                let span =
                    tracing_subscriber::registry::LookupSpan::span(registry, id).expect("the span");
                let extensions = span.extensions();
                let fields = extensions
                    .get::<FormattedFields<N>>()
                    .expect("formatted fields");
                fields.fields.clone()
            })
            .expect("a subscriber")
        }
        let ours = {
            let layer = tracing_subscriber::fmt::layer()
                .fmt_fields(SpanFields)
                .with_writer(std::io::sink);
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::with_default(subscriber, || fields::<SpanFields>(&make()))
        };
        let theirs = {
            let layer = tracing_subscriber::fmt::layer()
                .fmt_fields(JsonFields::new())
                .with_writer(std::io::sink);
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::with_default(subscriber, || fields::<JsonFields>(&make()))
        };
        let parse = |text: &str| -> serde_json::Value {
            serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
        };
        (parse(&ours), parse(&theirs))
    }

    #[test]
    fn the_object_is_the_one_json_fields_keeps() {
        let (ours, theirs) = both(|| {
            let span = tracing::info_span!(
                "http",
                method = %"POST",
                path = "/api/seckill/7",
                request_id = "a\"b\\c",
                count = 3_u64,
                delta = -4_i64,
                ratio = 0.5_f64,
                nan = f64::NAN,
                ok = true,
                error = &Oops as &(dyn std::error::Error + 'static),
                debug = ?Some(1),
                r#type = "raw",
                user_id = tracing::field::Empty,
                trace_id = tracing::field::Empty,
            );
            span.record("user_id", 42_u64);
            span.record("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736");
            span.record("user_id", 43_u64);
            span
        });
        assert_eq!(ours, theirs);
        assert_eq!(ours["user_id"], 43);
        assert_eq!(ours["error"], "it \"broke\"\n\tbadly \u{1} \\ ü");
    }

    #[test]
    fn a_span_without_fields_or_with_fields_only_recorded_later() {
        let (ours, theirs) = both(|| tracing::info_span!("empty"));
        assert_eq!(ours, theirs);
        let (ours, theirs) = both(|| {
            let span = tracing::info_span!("later", trace_id = tracing::field::Empty);
            span.record("trace_id", "abc");
            span
        });
        assert_eq!(ours, theirs);
        assert_eq!(ours["trace_id"], "abc");
    }
}
