//! The `sluice` binary: the composition root. It parses the command line,
//! loads the configuration, and wires store, engine and server together.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod cmd;
mod config;
mod malloc;
mod metrics_names;
mod peer;
mod runtime;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A Nostr relay with adaptive throttling"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay.
    Serve {
        /// TOML configuration file (see config/sluice.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Load JSONL events (plain, gzip or zstd) into the store.
    Import(cmd::import::ImportArgs),
    /// Write stored events as JSONL to standard output.
    Export(cmd::export::ExportArgs),
    /// Reconcile the local store with another relay over NIP-77 and copy
    /// the difference.
    Sync(cmd::sync::SyncArgs),
    /// Mirror another relay live until interrupted: its events into the
    /// local store (down), what it lacks of the local store's at each
    /// connection (up), or both; catching up by NIP-77 at every connection.
    Mirror(cmd::mirror::MirrorArgs),
    /// NIP-86 management of a running relay (signed with an admin key).
    Admin(cmd::admin::AdminArgs),
    /// Remove the stored events matching a filter, through a running
    /// relay's writer (NIP-86, admin key) or on a stopped store (--store).
    Delete(cmd::admin::DeleteArgs),
    /// Retention tools.
    Retention(cmd::retention::RetentionArgs),
    /// Web-of-trust tools (`trust explain PUBKEY`).
    Trust(cmd::trust::TrustArgs),
    /// Write a compacted copy of the store to OUT/data.mdb (a backup, taken
    /// while the relay serves).
    Compact(cmd::compact::CompactArgs),
    /// Build the NIP-50 search index again from the store (relay stopped).
    Reindex(cmd::reindex::ReindexArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate the configuration and print the effective values.
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve { .. }) {
        // Before any thread exists (docs/operating.md, "The allocator").
        malloc::reexec_for_serve();
    }
    let result = match cli.command {
        Command::Serve { config } => {
            Config::load(config.as_deref()).and_then(|cfg| cmd::serve::run(cfg, config))
        }
        Command::Import(args) => cmd::import::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Admin(args) => cmd::admin::run(args),
        Command::Delete(args) => cmd::admin::delete(args),
        Command::Retention(args) => cmd::retention::run(args),
        Command::Trust(args) => cmd::trust::run(args),
        Command::Sync(args) => cmd::sync::run(args),
        Command::Mirror(args) => cmd::mirror::run(args),
        Command::Compact(args) => cmd::compact::run(args),
        Command::Reindex(args) => cmd::reindex::run(args),
        Command::Config {
            command: ConfigCommand::Check { config },
        } => Config::load(config.as_deref()).and_then(|cfg| {
            let text = toml_text(&cfg)?;
            print!("{text}");
            eprintln!("configuration is valid");
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The effective configuration as TOML, one table per section (nested
/// sections as dotted tables).
fn toml_text(cfg: &Config) -> anyhow::Result<String> {
    let value = figment::value::Value::serialize(cfg)?;
    let dict = value
        .into_dict()
        .ok_or_else(|| anyhow::anyhow!("configuration is not a table"))?;
    let mut out = String::new();
    for (section, v) in dict {
        match v.as_array() {
            // `[[mirror]]`: an array of tables.
            Some(entries) => {
                for entry in entries {
                    let Some(d) = entry.as_dict() else { continue };
                    out.push_str(&format!("[[{section}]]\n"));
                    for (k, v) in d {
                        out.push_str(&format!("{} = {}\n", toml_key(k), toml_value(v)));
                    }
                    out.push('\n');
                }
            }
            None => write_table(&mut out, &section, v),
        }
    }
    Ok(out)
}

/// A key, quoted when it is not bare (`"#t"`).
fn toml_key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        serde_json::to_string(k).unwrap_or_default()
    }
}

fn write_table(out: &mut String, name: &str, v: figment::value::Value) {
    let Some(d) = v.into_dict() else { return };
    out.push_str(&format!("[{name}]\n"));
    let mut nested = Vec::new();
    for (k, v) in d {
        if v.as_dict().is_some() {
            nested.push((k, v));
        } else {
            out.push_str(&format!("{k} = {}\n", toml_value(&v)));
        }
    }
    out.push('\n');
    for (k, v) in nested {
        write_table(out, &format!("{name}.{k}"), v);
    }
}

fn toml_value(v: &figment::value::Value) -> String {
    use figment::value::Value;
    match v {
        Value::String(_, s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Bool(_, b) => b.to_string(),
        Value::Num(_, n) => n
            .to_u128()
            .map(|x| x.to_string())
            .or_else(|| n.to_i128().map(|x| x.to_string()))
            .or_else(|| n.to_f64().map(|x| x.to_string()))
            .unwrap_or_default(),
        Value::Array(_, a) => format!(
            "[{}]",
            a.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Dict(_, d) if d.is_empty() => "{}".to_string(),
        Value::Dict(_, d) => format!(
            "{{ {} }}",
            d.iter()
                .map(|(k, v)| format!("{} = {}", toml_key(k), toml_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => format!("{other:?}"),
    }
}
