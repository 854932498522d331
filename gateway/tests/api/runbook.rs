//! `docs/runbook.md`: every command in its `sh` blocks exists and is exercised.
//!
//! Each line of a ```` ```sh ```` block is one command (a trailing `\` continues it), and
//! each must be one of the forms below, or the test fails naming the line:
//! - `set -a; . ./.env; set +a`: the variables `scripts/compose-env.sh` writes;
//! - `GW=…`, `PRODUCT=…`, `ADMIN=$(…)`: the operator's handles, replaced by this platform's
//!   gateway, a product on sale in it, and an admin token minted as `seckill-token` would;
//! - `curl …` against `$GW` (the in-process gateway, with the admin token), RabbitMQ's
//!   management API on 127.0.0.1:15672 (the local broker, the test's account) or, inside the
//!   gateway's container, its operator port 9080 (the in-process operator listener): sent as
//!   written, and the answer must be a 2xx;
//! - `docker compose exec -T order-service order-service …`: parsed by order-service's real
//!   command line (`order_service::cli::Cli`) and run against the platform's namespace;
//! - `docker compose exec -T gateway seckill-token …`: its flags must be fields of
//!   `seckill-token`'s arguments, and the image must hold the binary;
//! - other `docker compose` subcommands (`ps`, `logs`, `restart`, `up`): every flag must be
//!   one the compose tool's own `--help` lists, every service one of `docker-compose.yml`.
//!   These act on containers, which this machine has none of: they are checked, not run.
//!
//! Afterwards the platform must be as the runbook found it: the breaker on `auto` and the
//! sale open (a purchase is accepted).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use chrono::{Duration as ChronoDuration, Utc};
use clap::Parser;
use serde_json::Value;

use seckill_auth::mint_token;
use seckill_testkit::JWT_SECRET;

use crate::compose::{compose, services};
use crate::helpers::{Platform, admin_token, spawn_platform, user_token};

const RUNBOOK: &str = include_str!("../../../docs/runbook.md");

/// The incidents, each a section (and so an anchor) of the runbook.
const SECTIONS: [&str; 7] = [
    "dead-letter-storm",
    "broker-down",
    "database-down",
    "redis-lost",
    "outbox-backlog",
    "queue-without-consumers",
    "purchase-5xx",
];

/// The alert rules (deploy/prometheus/alerts.yml).
const ALERTS: [&str; 6] = [
    "SeckillDeadLetterStorm",
    "SeckillOutboxBacklogGrowing",
    "SeckillBreakerOpen",
    "SeckillDeadLetterQueueGrowing",
    "SeckillQueueWithoutConsumers",
    "SeckillPurchaseServerErrors",
];

/// The dashboard's panels (deploy/grafana/dashboards/seckill.json).
const PANELS: [&str; 10] = [
    "Waiting room",
    "Waiting room answers and refusals",
    "Requests by outcome",
    "Accepted per second",
    "Orders per second",
    "Outbox oldest entry age",
    "Queue depth",
    "Dead letters by reason",
    "Breaker state",
    "Latency p99 by service",
];

/// The compose subcommands the runbook may use, each with its flags and how many values
/// each flag takes. Checked against the compose tool's own help as well.
const COMPOSE_FLAGS: [(&str, &[(&str, usize)]); 5] = [
    ("ps", &[]),
    ("logs", &[("--tail", 1)]),
    ("restart", &[]),
    ("up", &[("-d", 0), ("--scale", 1)]),
    ("exec", &[("-T", 0)]),
];

/// A file of the repository, by its path from the root.
fn repo_file(path: &str) -> Option<String> {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).ok()
}

/// The commands of the runbook's `sh` blocks: (line number, command).
fn commands(text: &str) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            assert!(
                pending.is_none(),
                "line {}: a `\\` continues into ```",
                index + 1
            );
            in_sh = !in_sh && trimmed == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let (start, mut command) = pending.take().unwrap_or((index + 1, String::new()));
        command.push_str(trimmed);
        if let Some(head) = command.strip_suffix('\\') {
            pending = Some((start, format!("{head} ")));
        } else if !command.is_empty() && !command.starts_with('#') {
            commands.push((start, command));
        }
    }
    commands
}

/// Where a `$(…)` substitution may appear: `date -u +%FT%TZ`, the same `-d '+N minutes'`
/// (or `hour`, `hours`) from now, and a token.
fn substitute(inner: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    if inner == "date -u +%FT%TZ" {
        return Ok(Utc::now().format("%FT%TZ").to_string());
    }
    let later = inner
        .strip_prefix("date -u -d '+")
        .and_then(|rest| rest.strip_suffix("' +%FT%TZ"))
        .and_then(|offset| offset.split_once(' '))
        .and_then(|(n, unit)| {
            let n: i64 = n.parse().ok()?;
            match unit {
                "minutes" => Some(ChronoDuration::minutes(n)),
                "hour" | "hours" => Some(ChronoDuration::hours(n)),
                _ => None,
            }
        });
    if let Some(later) = later {
        return Ok((Utc::now() + later).format("%FT%TZ").to_string());
    }
    let argv = words(inner, vars)?;
    match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [
            "docker",
            "compose",
            "exec",
            "-T",
            "gateway",
            "seckill-token",
            ref args @ ..,
        ] => seckill_token(args),
        _ => Err(format!("unknown substitution $({inner})")),
    }
}

/// Splits `line` into words as `sh` would: quotes, backslashes, `$NAME`, `${NAME}` and the
/// substitutions [`substitute`] knows; a `#` at a word's start ends the line. Anything else
/// (pipes, redirections, `;`, backquotes, an unknown variable) is an error.
fn words(line: &str, vars: &BTreeMap<String, String>) -> Result<Vec<String>, String> {
    let chars: Vec<char> = line.chars().collect();
    let (mut words, mut word, mut in_word, mut i) = (Vec::new(), String::new(), false, 0);
    while let Some(&c) = chars.get(i) {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                i += 1;
            }
            '#' if !in_word => break,
            '\'' => {
                let end = (i + 1..chars.len())
                    .find(|&j| chars[j] == '\'')
                    .ok_or("unterminated '")?;
                word.extend(&chars[i + 1..end]);
                in_word = true;
                i = end + 1;
            }
            '"' => {
                in_word = true;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("unterminated \"".into()),
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some('\\') if matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            word.push(chars[i + 1]);
                            i += 2;
                        }
                        Some('$') => i = expand(&chars, i, vars, &mut word)?,
                        Some('`') => return Err("backquotes".into()),
                        Some(&other) => {
                            word.push(other);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => {
                word.push(*chars.get(i + 1).ok_or("a trailing \\")?);
                in_word = true;
                i += 2;
            }
            '$' => {
                i = expand(&chars, i, vars, &mut word)?;
                in_word = true;
            }
            ';' | '|' | '&' | '<' | '>' | '`' | '(' | ')' => {
                return Err(format!("`{c}`: not one plain command"));
            }
            other => {
                word.push(other);
                in_word = true;
                i += 1;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// Expands the `$…` at `chars[at]` into `word`; returns the index after it.
fn expand(
    chars: &[char],
    at: usize,
    vars: &BTreeMap<String, String>,
    word: &mut String,
) -> Result<usize, String> {
    let lookup = |name: &str| {
        vars.get(name)
            .cloned()
            .ok_or_else(|| format!("${name} is not set by the runbook (nor by .env)"))
    };
    match chars.get(at + 1) {
        Some('{') => {
            let end = (at + 2..chars.len())
                .find(|&j| chars[j] == '}')
                .ok_or("unterminated ${")?;
            word.push_str(&lookup(&chars[at + 2..end].iter().collect::<String>())?);
            Ok(end + 1)
        }
        Some('(') => {
            let mut depth = 0;
            let end = (at + 1..chars.len())
                .find(|&j| {
                    match chars[j] {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .ok_or("unterminated $(")?;
            let inner: String = chars[at + 2..end].iter().collect();
            word.push_str(&substitute(inner.trim(), vars)?);
            Ok(end + 1)
        }
        Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
            let end = (at + 1..chars.len())
                .find(|&j| !(chars[j].is_ascii_alphanumeric() || chars[j] == '_'))
                .unwrap_or(chars.len());
            word.push_str(&lookup(&chars[at + 1..end].iter().collect::<String>())?);
            Ok(end)
        }
        _ => Err("a bare $".into()),
    }
}

/// `seckill-token ARGS`: each flag a field of its arguments (loadtest/src/bin/token.rs), the
/// binary in the image; mints what it would print (with the tests' JWT secret).
fn seckill_token(args: &[&str]) -> Result<String, String> {
    let source = repo_file("loadtest/src/bin/token.rs").ok_or("no loadtest/src/bin/token.rs")?;
    let dockerfile = repo_file("Dockerfile").ok_or("no Dockerfile")?;
    if !dockerfile.contains("target/release/seckill-token") {
        return Err("the image does not hold seckill-token".into());
    }
    let (mut sub, mut admin, mut ttl) = (None, false, 3600);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let field = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("seckill-token: unexpected {flag}"))?
            .replace('-', "_");
        if !source.contains(&format!("    {field}: ")) {
            return Err(format!("seckill-token has no {flag}"));
        }
        match *flag {
            "--admin" => admin = true,
            "--sub" | "--ttl-secs" => {
                let value: i64 = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("{flag} needs a number"))?;
                if *flag == "--sub" {
                    sub = Some(value);
                } else {
                    ttl = value;
                }
            }
            other => {
                return Err(format!(
                    "the runbook test does not know seckill-token {other}"
                ));
            }
        }
    }
    let sub = sub.ok_or("seckill-token needs --sub")?;
    let roles: &[&str] = if admin { &["admin"] } else { &[] };
    Ok(mint_token(JWT_SECRET, sub, roles, ttl))
}

/// The compose tool here: `docker compose` (v2), else `docker-compose` (v1).
fn compose_tool() -> Vec<&'static str> {
    let works = |argv: &[&str]| {
        Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&["docker", "compose", "version"]) {
        vec!["docker", "compose"]
    } else if works(&["docker-compose", "version"]) {
        vec!["docker-compose"]
    } else {
        panic!("no `docker compose` nor `docker-compose` here (scripts/tools.sh installs it)")
    }
}

/// Runs the runbook's commands against one platform.
struct Runner<'a> {
    platform: &'a Platform,
    product: i64,
    vars: BTreeMap<String, String>,
    services: BTreeSet<String>,
    /// The compose tool's `--help` of each subcommand used.
    help: BTreeMap<String, String>,
    tool: Vec<&'static str>,
    /// Commands run (not only checked).
    ran: usize,
}

impl<'a> Runner<'a> {
    fn new(platform: &'a Platform, product: i64) -> Self {
        let doc = compose();
        Self {
            platform,
            product,
            vars: BTreeMap::new(),
            services: services(&doc)
                .keys()
                .filter_map(|k| k.as_str().map(String::from))
                .collect(),
            help: BTreeMap::new(),
            tool: compose_tool(),
            ran: 0,
        }
    }

    async fn run(&mut self, line: &str) -> Result<(), String> {
        if line == "set -a; . ./.env; set +a" {
            return self.load_env();
        }
        let argv = words(line, &self.vars)?;
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        match argv[..] {
            [assignment] if assignment.contains('=') => self.assign(assignment),
            ["curl", ref args @ ..] => self.curl(args, false).await,
            ["docker", "compose", subcommand, ref args @ ..] => {
                self.docker_compose(subcommand, args).await
            }
            _ => Err("not a command the runbook test knows".into()),
        }
    }

    /// `. ./.env`: the variables scripts/compose-env.sh writes; the broker's account is this
    /// test's.
    fn load_env(&mut self) -> Result<(), String> {
        let script = repo_file("scripts/compose-env.sh").ok_or("no scripts/compose-env.sh")?;
        let amqp = reqwest::Url::parse(&self.platform.ns.amqp_url).map_err(|e| e.to_string())?;
        for line in script.lines() {
            let Some((name, _)) = line.split_once('=') else {
                continue;
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                continue;
            }
            let value = match name {
                "RABBITMQ_USER" => amqp.username().to_string(),
                "RABBITMQ_PASSWORD" => amqp.password().unwrap_or_default().to_string(),
                // Only the broker's account is used against real servers here.
                _ => format!("<{name} of .env>"),
            };
            self.vars.insert(name.to_string(), value);
        }
        Ok(())
    }

    /// `NAME=value`: the operator's handles, replaced by the platform's.
    fn assign(&mut self, assignment: &str) -> Result<(), String> {
        let (name, value) = assignment.split_once('=').unwrap_or_default();
        let value = match name {
            // The gateway's published port in docker-compose.yml.
            "GW" if value == "http://127.0.0.1:8080" => self.platform.gateway.clone(),
            "PRODUCT" if value.parse::<i64>().is_ok() => self.product.to_string(),
            // Minted by the substitution, with the tests' secret: used as it is.
            "ADMIN" if value.starts_with("ey") => value.to_string(),
            _ => return Err(format!("unexpected assignment {name}={value}")),
        };
        self.vars.insert(name.to_string(), value);
        Ok(())
    }

    /// `curl ARGS`: sent as written; `operator` when run inside the gateway's container.
    async fn curl(&mut self, args: &[&str], operator: bool) -> Result<(), String> {
        let (mut method, mut headers, mut body, mut user, mut url) =
            ("GET".to_string(), Vec::new(), None, None, None);
        let mut args = args.iter();
        while let Some(&arg) = args.next() {
            let mut value = || {
                args.next()
                    .map(|v| v.to_string())
                    .ok_or_else(|| format!("{arg} needs a value"))
            };
            match arg {
                "-X" => method = value()?,
                "-H" => headers.push(value()?),
                "-d" => body = Some(value()?),
                "-u" => user = Some(value()?),
                flags
                    if flags.starts_with('-') && flags[1..].chars().all(|c| "sSf".contains(c)) => {}
                flag if flag.starts_with('-') => {
                    return Err(format!("curl {flag}: not known here"));
                }
                target => {
                    if url.replace(target.to_string()).is_some() {
                        return Err("two URLs".into());
                    }
                }
            }
        }
        let url = url.ok_or("no URL")?;
        let url = if let Some(path) = url.strip_prefix("http://127.0.0.1:9080/") {
            if !operator {
                return Err("the gateway's operator port is not published on the host".into());
            }
            format!("{}/{path}", self.platform.gateway_admin)
        } else if url.starts_with(&self.platform.gateway)
            || url.starts_with("http://127.0.0.1:15672/api/")
        {
            url
        } else {
            return Err(format!(
                "{url}: not the gateway, nor RabbitMQ's management API"
            ));
        };
        let method: reqwest::Method = method.parse().map_err(|e| format!("{e}"))?;
        let mut request = self.platform.client.request(method, &url);
        for header in headers {
            let (name, value) = header
                .split_once(':')
                .ok_or_else(|| format!("header {header:?}"))?;
            request = request.header(name.trim(), value.trim());
        }
        if let Some(body) = body {
            // curl -d sends a form type unless told otherwise: the runbook must say JSON.
            request = request.body(body);
        }
        if let Some(user) = user {
            let (name, password) = user.split_once(':').ok_or("-u user:password")?;
            request = request.basic_auth(name, Some(password));
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(format!("{url}: {status} {text}"));
        }
        if url.ends_with("/metrics") {
            if !text.contains("# TYPE ") {
                return Err(format!("{url}: not Prometheus' text format: {text}"));
            }
        } else {
            serde_json::from_str::<Value>(&text)
                .map_err(|e| format!("{url}: not JSON ({e}): {text}"))?;
        }
        if url.contains(":15672/api/queues") {
            let queue = format!("\"{}.orders.created\"", self.platform.ns.namespace);
            if !text.contains(&queue) {
                return Err(format!("{url}: no {queue} in {text}"));
            }
        }
        self.ran += 1;
        Ok(())
    }

    async fn docker_compose(&mut self, subcommand: &str, args: &[&str]) -> Result<(), String> {
        let flags = COMPOSE_FLAGS
            .iter()
            .find(|(name, _)| *name == subcommand)
            .map(|(_, flags)| *flags)
            .ok_or_else(|| format!("docker compose {subcommand}: not known here"))?;
        let mut args = args.iter();
        let mut positional = Vec::new();
        while let Some(&arg) = args.next() {
            if arg.starts_with('-') {
                let (_, arity) = flags
                    .iter()
                    .find(|(flag, _)| *flag == arg)
                    .ok_or_else(|| format!("docker compose {subcommand} {arg}: not known here"))?;
                self.check_help(subcommand, arg)?;
                for _ in 0..*arity {
                    let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
                    if arg == "--scale" {
                        let (service, count) = value.split_once('=').ok_or("--scale S=N")?;
                        self.check_service(service)?;
                        count
                            .parse::<u32>()
                            .map_err(|_| format!("--scale {value}"))?;
                    }
                }
            } else if subcommand == "exec" {
                // exec SERVICE COMMAND...
                positional.push(arg);
                positional.extend(args.by_ref().copied());
            } else {
                positional.push(arg);
            }
        }
        if subcommand != "exec" {
            // Services only; the containers are not here to act on.
            return positional
                .into_iter()
                .try_for_each(|s| self.check_service(s));
        }
        let [service, ref command @ ..] = positional[..] else {
            return Err("exec needs a service and a command".into());
        };
        self.check_service(service)?;
        match (service, command) {
            ("order-service", ["order-service", cli @ ..]) => self.order_service(cli).await,
            ("gateway", ["curl", curl @ ..]) => {
                let dockerfile = repo_file("Dockerfile").unwrap_or_default();
                if !dockerfile.contains(" curl") {
                    return Err("the image has no curl".into());
                }
                self.curl(curl, true).await
            }
            ("postgres", ["psql", psql @ ..]) => self.psql(psql).await,
            _ => Err(format!("exec {service} {command:?}: not known here")),
        }
    }

    /// `psql -U USER -d DATABASE -c SQL`: the compose file's superuser and database, the SQL
    /// run on the platform's database.
    async fn psql(&mut self, args: &[&str]) -> Result<(), String> {
        let compose = repo_file("docker-compose.yml").unwrap_or_default();
        let mut sql = None;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || {
                args.next()
                    .copied()
                    .ok_or(format!("psql {arg} needs a value"))
            };
            match *arg {
                // The official image's superuser, which the compose file keeps.
                "-U" if value()? == "postgres" => {}
                "-d" => {
                    let database = value()?;
                    if !compose.contains(&format!("POSTGRES_DB: {database}")) {
                        return Err(format!(
                            "psql -d {database}: not the compose file's database"
                        ));
                    }
                }
                "-c" => sql = Some(value()?),
                other => return Err(format!("psql {other}: not known here")),
            }
        }
        let sql = sql.ok_or("psql without -c")?;
        let db = self.platform.ns.db().await;
        let ran = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&db)
            .await;
        db.close().await;
        ran.map_err(|e| format!("psql -c {sql}: {e}"))?;
        self.ran += 1;
        Ok(())
    }

    /// `order-service ARGS`: the real command line, run against the platform's namespace.
    async fn order_service(&mut self, args: &[&str]) -> Result<(), String> {
        let cli = order_service::cli::Cli::try_parse_from(
            std::iter::once("order-service").chain(args.iter().copied()),
        )
        .map_err(|e| e.to_string())?;
        let command = cli
            .command
            .ok_or("no subcommand: that would run the service")?;
        let settings = order_service::Settings {
            backend: self.platform.ns.backend_settings(),
            ..order_service::Settings::default()
        };
        command
            .run(&settings)
            .await
            .map_err(|e| format!("order-service {}: {e:#}", args.join(" ")))?;
        self.ran += 1;
        Ok(())
    }

    fn check_service(&self, service: &str) -> Result<(), String> {
        if self.services.contains(service) {
            Ok(())
        } else {
            Err(format!("docker-compose.yml has no service `{service}`"))
        }
    }

    /// The compose tool's own help of `subcommand` must list `flag`.
    fn check_help(&mut self, subcommand: &str, flag: &str) -> Result<(), String> {
        let tool = self.tool.clone();
        let help = self.help.entry(subcommand.to_string()).or_insert_with(|| {
            let output = Command::new(tool[0])
                .args(&tool[1..])
                .args([subcommand, "--help"])
                .output()
                .expect("run the compose tool");
            String::from_utf8_lossy(&output.stdout).into_owned()
        });
        let listed = help
            .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
            .any(|w| w == flag);
        if listed {
            Ok(())
        } else {
            Err(format!(
                "`{} {subcommand} --help` lists no {flag}",
                tool.join(" ")
            ))
        }
    }
}

/// The breaker's mode every replica follows, through the gateway.
async fn breaker_mode(platform: &Platform) -> Value {
    let body: Value = platform
        .get("/admin/orders/breaker", &admin_token())
        .await
        .json()
        .await
        .expect("breaker status JSON");
    body["mode"].clone()
}

#[tokio::test]
async fn every_command_of_the_runbook_exists_and_runs() {
    let platform = spawn_platform().await;
    let product = platform.create_product(10, -60).await;
    let mut runner = Runner::new(&platform, product);
    let commands = commands(RUNBOOK);
    let mut failures = Vec::new();
    for (line, command) in &commands {
        if let Err(error) = runner.run(command).await {
            failures.push(format!("docs/runbook.md:{line}: {command}\n    {error}"));
        }
    }
    assert!(
        failures.is_empty(),
        "runbook commands that do not exist or fail:\n{}",
        failures.join("\n")
    );
    assert!(
        runner.ran >= 30,
        "only {} of {} commands ran",
        runner.ran,
        commands.len()
    );
    // The runbook hands back what it forced and reopens what it paused.
    assert_eq!(breaker_mode(&platform).await, "auto");
    let response = platform.buy(product, &user_token(4242)).await;
    assert_eq!(response.status(), 202, "the sale is still paused");
    platform.shutdown().await;
}

#[tokio::test]
async fn a_command_that_does_not_exist_fails_the_runbook_test() {
    let platform = spawn_platform().await;
    let product = platform.create_product(10, -60).await;
    let mut runner = Runner::new(&platform, product);
    for line in [
        "set -a; . ./.env; set +a",
        "GW=http://127.0.0.1:8080",
        "PRODUCT=1",
        "ADMIN=$(docker compose exec -T gateway seckill-token --sub 1 --admin)",
    ] {
        runner.run(line).await.expect(line);
    }
    for wrong in [
        "docker compose exec -T order-service order-service breaker pause",
        "docker compose exec -T order-service order-service dead-letters redrive --product \"$PRODUCT\" --dry",
        "docker compose exec -T order-service order-service dead-letters purge",
        "docker compose exec -T gateway seckill-token --sub 1 --root",
        "curl -sS \"$GW/admin/dlq/purge\" -H \"Authorization: Bearer $ADMIN\"",
        "curl -sS -X DELETE \"$GW/admin/orders/breaker\" -H \"Authorization: Bearer $ADMIN\"",
        "curl -sS \"$GW/admin/products/$PRODUCT/stock\"",
        "curl -sS http://127.0.0.1:9080/metrics",
        "curl -sS \"$GW/admin/products/$PRODUCT/stock\" -H \"Authorization: Bearer $NOBODY\"",
        "docker compose logs --follow-all order-service",
        "docker compose restart nginx",
        "docker compose up -d --scale seckill=3",
        "docker compose down -v",
        "redis-cli FLUSHALL",
        "curl -sS \"$GW/admin/orders/breaker\" | jq .mode",
    ] {
        assert!(runner.run(wrong).await.is_err(), "accepted: {wrong}");
    }
    platform.shutdown().await;
}

#[test]
fn the_runbook_has_a_section_per_incident_naming_its_alert_and_panel() {
    let mut sections: BTreeMap<&str, String> = BTreeMap::new();
    let mut current = None;
    for line in RUNBOOK.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            current = Some(title.trim());
        } else if let Some(title) = current {
            let text = sections.entry(title).or_default();
            text.push_str(line);
            text.push('\n');
        }
    }
    for name in SECTIONS {
        let text = sections
            .get(name)
            .unwrap_or_else(|| panic!("no section `## {name}` (anchor #{name})"));
        assert!(
            ALERTS
                .iter()
                .any(|alert| text.contains(&format!("`{alert}`"))),
            "`{name}` names no alert"
        );
        assert!(
            PANELS
                .iter()
                .any(|panel| text.contains(&format!("\"{panel}\""))),
            "`{name}` names no dashboard panel"
        );
        assert!(text.contains("```sh"), "`{name}` has no commands");
    }
    for alert in ALERTS {
        assert!(
            RUNBOOK.contains(alert),
            "the runbook never mentions {alert}"
        );
    }
    // Every alert and panel the runbook names exists, once the rules and the dashboard do.
    let named_alerts: BTreeSet<&str> = RUNBOOK
        .split('`')
        .filter(|w| w.starts_with("Seckill") && w.chars().all(char::is_alphanumeric))
        .collect();
    for alert in &named_alerts {
        assert!(
            ALERTS.contains(alert),
            "the runbook names an unknown alert {alert}"
        );
    }
    if let Some(rules) = repo_file("deploy/prometheus/alerts.yml") {
        for alert in &named_alerts {
            assert!(
                rules.contains(&format!("alert: {alert}")),
                "deploy/prometheus/alerts.yml has no {alert}"
            );
        }
    }
    if let Some(dashboard) = repo_file("deploy/grafana/dashboards/seckill.json") {
        for panel in PANELS
            .iter()
            .filter(|p| RUNBOOK.contains(&format!("\"{p}\"")))
        {
            assert!(
                dashboard.contains(&format!("\"title\": \"{panel}\""))
                    || dashboard.contains(&format!("\"title\":\"{panel}\"")),
                "the dashboard has no panel {panel:?}"
            );
        }
    }
    // The README links the runbook.
    let readme = repo_file("README.md").expect("README.md");
    assert!(
        readme.contains("docs/runbook.md"),
        "the README does not link the runbook"
    );
}
