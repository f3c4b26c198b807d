//! `engram token`: make and hash bearer tokens for the tokens file, on the
//! operator's machine (no server involved).

use std::io::Read;

use serde_json::json;

use super::{CliError, CliResult, Output};
use crate::auth;

#[derive(Debug, clap::Args)]
pub struct TokenCommand {
    #[command(subcommand)]
    action: Action,

    /// Output format: text for people, json for scripts
    #[arg(long, value_enum, default_value_t = Output::Text, global = true)]
    output: Output,

    /// The same as --output json
    #[arg(long, global = true, conflicts_with = "output")]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Make a random token for a tenant: prints the token (give it to the
    /// client) and the line for the tokens file (which holds only its hash)
    New {
        /// The tenant whose data the token reaches
        #[arg(long)]
        tenant: String,
        /// Give the token the admin role (MemoryAdminService, deleting
        /// whole sessions)
        #[arg(long)]
        admin: bool,
    },
    /// Print the SHA-256 of a token read from stdin, as the tokens file
    /// holds it
    Hash,
}

impl TokenCommand {
    fn output(&self) -> Output {
        if self.json { Output::Json } else { self.output }
    }

    pub fn run(self) -> CliResult {
        let output = self.output();
        match self.action {
            Action::New { tenant, admin } => {
                // Checked before the line is made: a space in it would read
                // as a role ("unknown role"), a '#' as a comment.
                if !crate::context::Tenant::is_valid_name(&tenant) {
                    return Err(CliError::usage(format!(
                        "--tenant {tenant:?} must be {}",
                        crate::context::Tenant::NAME_RULE
                    )));
                }
                let token = auth::new_token();
                let hash = auth::hash_token(&token);
                let line = format!("{hash} {tenant}{}", if admin { " admin" } else { "" });
                // The line goes through the same parser as the server's.
                auth::Authenticator::parse(&line).map_err(|err| CliError::usage(err.message))?;
                match output {
                    Output::Json => super::print_json(&json!({
                        "token": token,
                        "sha256": hash,
                        "tenant": tenant,
                        "admin": admin,
                        "line": line,
                    })),
                    Output::Text => {
                        outln!("token: {token}");
                        outln!("tokens file line: {line}");
                    }
                }
            }
            Action::Hash => {
                let mut token = String::new();
                std::io::stdin()
                    .read_to_string(&mut token)
                    .map_err(|err| CliError::usage(format!("cannot read stdin: {err}")))?;
                let token = token.trim();
                if token.is_empty() {
                    return Err(CliError::usage("no token on stdin"));
                }
                let hash = auth::hash_token(token);
                match output {
                    Output::Json => super::print_json(&json!({ "sha256": hash })),
                    Output::Text => outln!("{hash}"),
                }
            }
        }
        Ok(())
    }
}
