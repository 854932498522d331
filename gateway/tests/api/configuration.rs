//! The configuration reference: `docs/configuration.md` and the loader's list of every
//! service's settings (`crates/config/src/known.rs`) are what the settings types say — the
//! names and defaults from the types themselves, each description from its field's doc
//! comment, read from the source. A setting without a doc comment fails here; so does a
//! committed file the code no longer describes, with the difference and the command that
//! regenerates both. The variables the scripts and `docker-compose.yml` set must be ones the
//! loader accepts: a service they start would otherwise refuse to run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use seckill_config::variables::{self, PREFIX};
use serde::Serialize;
use serde_json::Value;

/// How to bring both files back in step with the code.
const REGENERATE: &str =
    "SECKILL_UPDATE_CONFIGURATION=1 cargo test -p gateway --test api configuration";

/// The line that ends the hand-written header of `docs/configuration.md`; everything after
/// it is generated.
const GENERATED_BELOW: &str =
    "<!-- Everything below is generated from the settings types; edit their doc comments. -->";

/// One table of the reference: the settings of one struct.
struct Group {
    title: &'static str,
    /// What the table holds, in a sentence.
    intro: &'static str,
    /// The file defining `type_name`, relative to the repository.
    source: &'static str,
    type_name: &'static str,
    /// The services reading it, by their own prefix (`SECKILL_<PREFIX>_…`).
    prefixes: &'static [&'static str],
    /// The defaults as the type serializes them: the written form of each value.
    defaults: serde_json::Map<String, Value>,
    /// Whether the type flattens the shared group into itself (listed there, not here).
    flattens_shared: bool,
}

/// The services as `seckill_config::load` is called in their binaries: name, own prefix.
const SERVICES: [(&str, &str); 3] = [
    ("gateway", "gateway"),
    ("seckill-api", "api"),
    ("order-service", "order"),
];

fn defaults<T: Serialize + Default>() -> serde_json::Map<String, Value> {
    match serde_json::to_value(T::default()).expect("settings serialize") {
        Value::Object(fields) => fields,
        other => panic!("settings serialize to an object, not {other}"),
    }
}

fn groups() -> Vec<Group> {
    vec![
        Group {
            title: "Shared by seckill-api and order-service",
            intro: "Stores, namespace, keys and logging of both backends \
                    (`BackendSettings`, flattened into each one's settings).",
            source: "crates/config/src/lib.rs",
            type_name: "BackendSettings",
            prefixes: &["api", "order"],
            defaults: defaults::<seckill_config::BackendSettings>(),
            flattens_shared: false,
        },
        Group {
            title: "gateway",
            intro: "The public face: tokens, limits, upstreams.",
            source: "gateway/src/config.rs",
            type_name: "Settings",
            prefixes: &["gateway"],
            defaults: defaults::<gateway::Settings>(),
            flattens_shared: false,
        },
        Group {
            title: "seckill-api",
            intro: "Purchases, stock and the outbox; plus the shared settings above.",
            source: "seckill-api/src/config.rs",
            type_name: "Settings",
            prefixes: &["api"],
            defaults: defaults::<seckill_api::Settings>(),
            flattens_shared: true,
        },
        Group {
            title: "order-service",
            intro: "Orders from the queue, retries, the breaker, payment windows; plus the \
                    shared settings above.",
            source: "order-service/src/config.rs",
            type_name: "Settings",
            prefixes: &["order"],
            defaults: defaults::<order_service::Settings>(),
            flattens_shared: true,
        },
    ]
}

/// Every service's settings keys, as the loader sees them, by own prefix.
fn service_keys() -> Vec<(&'static str, BTreeSet<String>)> {
    let keys = |map: serde_json::Map<String, Value>| map.into_iter().map(|(k, _)| k).collect();
    vec![
        ("gateway", keys(defaults::<gateway::Settings>())),
        ("api", keys(defaults::<seckill_api::Settings>())),
        ("order", keys(defaults::<order_service::Settings>())),
    ]
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One field of a settings struct as its source declares it.
struct Field {
    /// The key the loader fills: the field's name, or its `#[serde(rename)]`.
    key: String,
    /// The doc comment, one paragraph.
    doc: String,
    /// Whether it holds a `Secret` (possibly optional).
    secret: bool,
}

/// The fields of struct `type_name` in `source`, flattened ones left out (their own group
/// lists them). Panics on a field without a doc comment.
fn fields(source: &str, type_name: &str) -> Vec<Field> {
    let path = repo().join(source);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {source}: {e}"));
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("parse {source}: {e}"));
    let item = file
        .items
        .iter()
        .find_map(|item| match item {
            syn::Item::Struct(s) if s.ident == type_name => Some(s),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{source} defines no struct {type_name}"));
    let mut out = Vec::new();
    for field in &item.fields {
        let name = field.ident.as_ref().expect("named fields").to_string();
        let mut key = name.clone();
        let mut flatten = false;
        let mut doc_lines = Vec::new();
        for attr in &field.attrs {
            if attr.path().is_ident("doc") {
                if let syn::Meta::NameValue(nv) = &attr.meta
                    && let syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(line),
                        ..
                    }) = &nv.value
                {
                    doc_lines.push(line.value().trim().to_string());
                }
            } else if attr.path().is_ident("serde") {
                attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("rename") {
                        key = meta.value()?.parse::<syn::LitStr>()?.value();
                    } else if meta.path.is_ident("flatten") {
                        flatten = true;
                    } else if meta.input.peek(syn::Token![=]) {
                        meta.value()?.parse::<syn::Expr>()?;
                    }
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{source}: serde attribute of `{name}`: {e}"));
            }
        }
        if flatten {
            continue;
        }
        let doc = doc_lines
            .iter()
            .filter(|line| !line.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            !doc.is_empty(),
            "setting `{key}` ({type_name} in {source}) has no doc comment: docs/configuration.md \
             takes its description from there"
        );
        let ty = &field.ty;
        let ty = quote_type(ty);
        out.push(Field {
            key,
            doc,
            secret: ty == "Secret" || ty == "Option<Secret>",
        });
    }
    out
}

/// A field's type as written, without spaces (`Option<Secret>`).
fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(path) => path
            .path
            .segments
            .iter()
            .map(|segment| {
                let args = match &segment.arguments {
                    syn::PathArguments::AngleBracketed(args) => format!(
                        "<{}>",
                        args.args
                            .iter()
                            .map(|arg| match arg {
                                syn::GenericArgument::Type(t) => quote_type(t),
                                _ => "_".into(),
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    _ => String::new(),
                };
                format!("{}{args}", segment.ident)
            })
            .collect::<Vec<_>>()
            .join("::"),
        _ => "_".into(),
    }
}

/// A default as an operator writes it.
fn written(value: &Value, secret: bool) -> String {
    let public = [
        seckill_config::DEV_JWT_SECRET,
        seckill_config::DEV_INTERNAL_KEY,
        seckill_config::DEV_ORDER_SIGNING_KEY,
    ];
    match value {
        Value::Null => "unset".into(),
        Value::String(s) if s.is_empty() => "empty".into(),
        Value::String(s) if secret && public.contains(&s.as_str()) => {
            format!("`{s}` (public: refused at start, see above)")
        }
        Value::String(s) => format!("`{s}`"),
        other => format!("`{other}`"),
    }
}

/// A table cell: no line breaks, no column separators.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The generated part of `docs/configuration.md`.
fn reference() -> String {
    let mut out = String::new();
    for group in groups() {
        let fields = fields(group.source, group.type_name);
        let declared: BTreeSet<&str> = fields.iter().map(|f| f.key.as_str()).collect();
        let shared: BTreeSet<String> = defaults::<seckill_config::BackendSettings>()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let serialized: BTreeSet<&str> = group
            .defaults
            .keys()
            .map(String::as_str)
            .filter(|k| !(group.flattens_shared && shared.contains(*k)))
            .collect();
        assert_eq!(
            declared, serialized,
            "{} in {}: the fields read from the source are the keys the type serializes",
            group.type_name, group.source
        );
        out.push_str(&format!(
            "\n## {}\n\n{} Source: `{}` (`{}`).\n\n| variable | default | description |\n|---|---|---|\n",
            group.title, group.intro, group.source, group.type_name
        ));
        for field in &fields {
            let mut names = Vec::new();
            let own: Vec<String> = group
                .prefixes
                .iter()
                .map(|p| variables::variable(&variables::service_prefix(p), &field.key))
                .collect();
            let shared = variables::variable(PREFIX, &field.key);
            // The shared form first where the group is shared, the service's own otherwise.
            if group.prefixes.len() > 1 {
                names.push(shared);
                names.extend(own);
            } else {
                names.extend(own);
                names.push(shared);
            }
            let names = names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join("<br>");
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                names,
                cell(&written(&group.defaults[&field.key], field.secret)),
                cell(&field.doc),
            ));
        }
    }
    out
}

/// `crates/config/src/known.rs`: every service's keys, for the loader's check.
fn known() -> String {
    let mut out = String::from(
        "//! Every service's settings keys: what may follow `SECKILL_` or a service's own prefix\n\
         //! (see [`crate::variables`]).\n\
         //!\n\
         //! Generated from the settings types with `docs/configuration.md`; do not edit by hand:\n",
    );
    out.push_str(&format!("//! `{REGENERATE}`.\n\n"));
    out.push_str(
        "/// Each service's own prefix (`SECKILL_<PREFIX>_…`, as its binary calls `load`) and\n\
         /// its settings keys, sorted.\n\
         #[rustfmt::skip]\n\
         pub const SETTINGS: &[(&str, &[&str])] = &[\n",
    );
    for (prefix, keys) in service_keys() {
        out.push_str(&format!("    (\"{prefix}\", &[\n"));
        for key in keys {
            out.push_str(&format!("        \"{key}\",\n"));
        }
        out.push_str("    ]),\n");
    }
    out.push_str("];\n");
    out
}

/// The lines only in `old` (`-`) and only in `new` (`+`), in order, with their line numbers.
fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // Longest common subsequence, from the end.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+{:>4} {}\n", j + 1, b[j]));
            j += 1;
        } else {
            out.push_str(&format!("-{:>4} {}\n", i + 1, a[i]));
            i += 1;
        }
    }
    out
}

/// Writes `generated` to `path` under `SECKILL_UPDATE_CONFIGURATION`, else fails with the
/// difference when the committed file is not it.
fn check_or_write(path: &Path, generated: &str) {
    if std::env::var_os("SECKILL_UPDATE_CONFIGURATION").is_some() {
        std::fs::write(path, generated).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is not what the code describes (- committed, + generated):\n{}\
         Regenerate it with:\n  {REGENERATE}",
        path.strip_prefix(repo()).unwrap_or(path).display(),
        diff(&committed, generated),
    );
}

#[test]
fn the_configuration_reference_is_the_one_the_settings_types_describe() {
    let path = repo().join("docs/configuration.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let header = committed
        .split_once(GENERATED_BELOW)
        .map(|(header, _)| header)
        .unwrap_or_else(|| {
            panic!(
                "docs/configuration.md has no line {GENERATED_BELOW:?} ending its hand-written \
                 header"
            )
        });
    check_or_write(
        &path,
        &format!("{header}{GENERATED_BELOW}\n{}", reference()),
    );
}

#[test]
fn the_loaders_list_of_settings_is_the_one_the_settings_types_describe() {
    check_or_write(&repo().join("crates/config/src/known.rs"), &known());
}

#[test]
fn the_loaders_prefixes_are_the_ones_the_binaries_load_with() {
    use seckill_service::Service;
    let loaded = [
        (gateway::Settings::NAME, gateway::Settings::PREFIX),
        (seckill_api::Settings::NAME, seckill_api::Settings::PREFIX),
        (
            order_service::Settings::NAME,
            order_service::Settings::PREFIX,
        ),
    ];
    assert_eq!(loaded, SERVICES, "the binaries' start-up prefixes");
    let prefixes: Vec<&str> = seckill_config::known::SETTINGS
        .iter()
        .map(|(p, _)| *p)
        .collect();
    let expected: Vec<&str> = SERVICES.iter().map(|(_, p)| *p).collect();
    assert_eq!(prefixes, expected);
}

/// Every `SECKILL_*` name in the files that set variables for services: the scripts that
/// start them, the compose file, the chaos scenarios.
fn names_set_by_the_repository() -> BTreeSet<(String, String)> {
    let mut files: Vec<PathBuf> = ["docker-compose.yml", "Dockerfile"]
        .iter()
        .map(|f| repo().join(f))
        .collect();
    for dir in ["scripts", "loadtest/src/chaos"] {
        for entry in std::fs::read_dir(repo().join(dir)).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(PREFIX) {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            // `SECKILL_GATEWAY_…` in prose is a family, not a variable.
            if !name.ends_with('_') {
                let shown = file.strip_prefix(repo()).unwrap_or(&file).display();
                names.insert((name.to_string(), shown.to_string()));
            }
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn every_variable_the_scripts_and_compose_set_is_one_every_service_accepts() {
    let names = names_set_by_the_repository();
    assert!(
        names.iter().any(|(n, _)| n == "SECKILL_ORDER_SIGNING_KEY"),
        "the scan found the compose file's variables"
    );
    let all = variables::all_keys();
    let mut refused = Vec::new();
    for (prefix, own) in service_keys() {
        for unknown in
            variables::unknown_variables(names.iter().map(|(n, _)| n.as_str()), prefix, &own, &all)
        {
            let files: Vec<&str> = names
                .iter()
                .filter(|(n, _)| *n == unknown.name)
                .map(|(_, f)| f.as_str())
                .collect();
            refused.push(format!("{prefix}: {unknown} (in {})", files.join(", ")));
        }
    }
    assert!(
        refused.is_empty(),
        "variables a service would refuse at start:\n{}",
        refused.join("\n")
    );
}
