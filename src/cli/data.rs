//! `engram forget-user`: a tenant's data as a whole.

use serde_json::json;

use super::{CliResult, ClientArgs, Output, connect, print_json};
use crate::proto;
use crate::proto::data_service_client::DataServiceClient;

/// Delete everything about one user of one app (admin token)
#[derive(Debug, clap::Args)]
pub struct ForgetUserCommand {
    #[command(flatten)]
    client: ClientArgs,

    /// The app the user belongs to
    #[arg(long)]
    app: String,

    /// The user to forget
    #[arg(long)]
    user: String,

    /// A further execution id known to be one of the user's runs (repeatable;
    /// execution scopes named by the user's session ids go anyway)
    #[arg(long = "execution-id")]
    execution_ids: Vec<String>,

    /// Print what would be deleted; delete nothing
    #[arg(long)]
    dry_run: bool,
}

impl ForgetUserCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let done = DataServiceClient::new(channel)
            .forget_user(proto::ForgetUserRequest {
                app: self.app,
                user: self.user,
                execution_ids: self.execution_ids,
                dry_run: self.dry_run,
            })
            .await?
            .into_inner();
        match self.client.output {
            Output::Json => print_json(&forgotten_json(&done)),
            Output::Text => {
                let verb = if done.dry_run {
                    "would delete"
                } else {
                    "deleted"
                };
                println!(
                    "{verb} {} sessions, {} episodes, {} facts, {} working-memory items, \
                     {} execution scopes ({} versions)",
                    done.sessions,
                    done.episodes,
                    done.facts,
                    done.working_items,
                    done.execution_scopes,
                    done.memory_versions
                );
                if !done.audit_key.is_empty() {
                    println!(
                        "audit record: {} in namespace engram.forgotten",
                        done.audit_key
                    );
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn forgotten_json(done: &proto::ForgetUserResponse) -> serde_json::Value {
    json!({
        "sessions": done.sessions,
        "episodes": done.episodes,
        "facts": done.facts,
        "working_items": done.working_items,
        "execution_scopes": done.execution_scopes,
        "memory_versions": done.memory_versions,
        "dry_run": done.dry_run,
        "audit_key": done.audit_key,
    })
}
