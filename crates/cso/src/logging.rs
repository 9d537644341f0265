//! Log output: JSON lines shaped like the Go operator's (`time`, `level` in capitals, `logger`, `message`,
//! then the fields), so existing log pipelines keep parsing them; or text. `--log-level` means what it means
//! for the Go operator; `RUST_LOG` overrides it for debugging.

use std::{fmt, io::IsTerminal};

use serde_json::{Map, Value};
use tracing::{Event, Subscriber, field::Field};
use tracing_subscriber::{
    EnvFilter,
    fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter, format::Writer},
    registry::LookupSpan,
    util::SubscriberInitExt,
};

/// The kube client logs every failed request at ERROR before returning the error to its caller, which
/// reports it; readiness polling would flood the log.
const QUIET: &str = "kube_client::client::builder=off";

/// `--log-level` as the Go operator reads it: `debug`, `error`, anything else is `info`.
pub fn level_filter(log_level: &str) -> String {
    let level = match log_level {
        "debug" => "debug",
        "error" => "error",
        _ => "info",
    };
    format!("{level},{QUIET}")
}

pub fn init(log_level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| level_filter(log_level).into());
    if json {
        json_subscriber(filter, std::io::stderr).init();
    } else {
        // Colours only for a person at a terminal; a file or a log collector gets plain text.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init();
    }
}

/// The subscriber of `--log-format=json`, writing to `writer`. Never with ANSI colour codes: the span fields
/// of the `context` key are formatted by the text formatter, which would otherwise colour them.
fn json_subscriber<W>(filter: EnvFilter, writer: W) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .event_format(GoStyleJson)
        .finish()
}

/// One JSON object per event, keys as the Go operator (zap) writes them.
struct GoStyleJson;

impl<S, N> FormatEvent<S, N> for GoStyleJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        let mut line = Map::new();
        line.insert(
            "time".into(),
            Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
        line.insert(
            "level".into(),
            Value::String(metadata.level().as_str().to_owned()),
        );
        line.insert("logger".into(), Value::String(metadata.target().to_owned()));
        let mut fields = FieldsToJson(Map::new());
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or(Value::String(String::new()));
        line.insert("message".into(), message);
        line.extend(fields.0);
        // The fields of the enclosing spans, such as the object a reconcile is about.
        let spans: Vec<String> = ctx
            .event_scope()
            .into_iter()
            .flat_map(|scope| scope.from_root())
            .filter_map(|span| {
                let extensions = span.extensions();
                let fields = extensions.get::<FormattedFields<N>>()?;
                (!fields.is_empty()).then(|| format!("{}{{{fields}}}", span.name()))
            })
            .collect();
        if !spans.is_empty() {
            line.insert("context".into(), Value::String(spans.join(" ")));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

struct FieldsToJson(Map<String, Value>);

impl tracing::field::Visit for FieldsToJson {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::sync::{Arc, Mutex};

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn json_lines_are_plain_json_without_colour_codes() {
        let captured = Captured::default();
        let subscriber = json_subscriber(EnvFilter::new("info"), captured.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile", object = "ClusterAddon/ns/cluster-addon-c1");
            let _entered = span.enter();
            tracing::warn!(retry_in = 5, "reconcile failed");
        });
        let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        // Escape codes would appear JSON-escaped (`\u001b`) inside the strings.
        assert!(
            !output.contains('\u{1b}') && !output.to_lowercase().contains("\\u001b"),
            "ANSI escape codes in {output}"
        );
        let line: Value = serde_json::from_str(output.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "reconcile failed");
        assert_eq!(line["retry_in"], 5);
        assert_eq!(
            line["context"],
            "reconcile{object=\"ClusterAddon/ns/cluster-addon-c1\"}"
        );
    }
}
