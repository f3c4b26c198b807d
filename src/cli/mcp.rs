//! `engram mcp`: the MCP server over stdio, for an assistant to spawn.
//!
//! It talks to a running Engram server over gRPC with the CLI's flags
//! (`--server`, `--token`, the TLS ones), so an assistant's configuration
//! is one line: `{"command": "engram", "args": ["mcp", "--server", "…"]}`.
//! Standard output carries the protocol only; diagnostics go to stderr.

use rmcp::ServiceExt;

use super::{CliError, CliResult, ConnectArgs, connect_channel, exit};
use crate::mcp::{self, Engram};

#[derive(Debug, clap::Args)]
pub struct McpCommand {
    #[command(flatten)]
    client: ConnectArgs,
}

impl McpCommand {
    pub async fn run(self) -> CliResult {
        let authorization = match &self.client.token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| CliError::usage("--token must be printable ASCII"))?,
            ),
            None => None,
        };
        let channel = connect_channel(&self.client).await?;
        let conn = mcp::connection(channel, authorization);
        // Admin tools are listed only when the token may use them.
        let admin = mcp::probe_admin(&conn).await?;
        let running = Engram::new(conn, admin)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|err| CliError {
                message: format!("MCP session failed to start: {err}"),
                code: exit::FAILURE,
            })?;
        running.waiting().await.map_err(|err| CliError {
            message: format!("MCP session ended with an error: {err}"),
            code: exit::FAILURE,
        })?;
        Ok(())
    }
}
