//! `engram sessions ...` and `engram episodes ...`: sessions and their event
//! logs from a shell.

use serde_json::json;

use super::follow::Follow;
use super::{
    CliError, CliResult, ClientArgs, Output, all_pages, connect, given_or_stdin, parse_value,
    plural, print_json, time, value_json,
};
use crate::api::convert::{json_to_proto, object_to_proto};
use crate::proto;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::session_service_client::SessionServiceClient;

#[derive(Debug, clap::Args)]
pub struct SessionsCommand {
    #[command(flatten)]
    client: ClientArgs,

    #[command(subcommand)]
    command: SessionCommand,
}

/// The owner a command names next to a session id (checked by the server).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OwnerArgs {
    /// The session's app
    #[arg(long, default_value = "", hide_default_value = true)]
    app: String,
    /// The session's user
    #[arg(long, default_value = "", hide_default_value = true)]
    user: String,
}

/// `--request-id` of a command that creates something (a session, a task,
/// a fact, a rule; a tool call): what makes repeating it safe.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RequestIdArg {
    /// An id that makes repeating this command safe: a repeat is answered
    /// with what the first one created (default: a new random id, so this
    /// command's own retries are safe)
    #[arg(long)]
    request_id: Option<String>,
}

impl RequestIdArg {
    /// The id given, or a new random one.
    pub fn or_random(self) -> String {
        self.request_id
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())
    }
}

#[derive(Debug, clap::Subcommand)]
enum SessionCommand {
    /// Create a session (prints it); --id is optional, a UUIDv7 otherwise
    Create {
        /// The app the session belongs to
        #[arg(long)]
        app: String,
        /// The user the session belongs to
        #[arg(long)]
        user: String,
        /// The id to give the session
        #[arg(long, default_value = "", hide_default_value = true)]
        id: String,
        /// A JSON object of attributes to keep with the session
        #[arg(long)]
        metadata: Option<String>,
        /// Return the session if it exists already (for this app and user)
        #[arg(long)]
        if_missing: bool,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// Print a session
    Get {
        /// The session's id
        id: String,
        #[command(flatten)]
        owner: OwnerArgs,
    },
    /// List sessions, newest first (every page)
    List {
        #[command(flatten)]
        owner: OwnerArgs,
    },
    /// Delete a session with its episodes
    Delete {
        /// The session's id
        id: String,
        #[command(flatten)]
        owner: OwnerArgs,
    },
    /// End a session: later appends are refused
    End {
        /// The session's id
        id: String,
        #[command(flatten)]
        owner: OwnerArgs,
        /// Also delete its episodes
        #[arg(long)]
        delete_episodes: bool,
    },
    /// Delete the sessions idle for longer than --max-age (e.g. 24h, 30m, 7d): nothing appended and nothing written to their working memory
    Cleanup {
        /// How long a session must have been idle (90s, 30m, 24h, 7d)
        #[arg(long, value_parser = parse_age)]
        max_age: std::time::Duration,
        /// Count what would go, delete nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Count sessions and episodes
    Stats,
}

/// `90s`, `30m`, `24h`, `7d`, or plain seconds.
pub(crate) fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 30m, 24h or 7d"))?;
    let seconds = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("unknown unit {unit:?}; use s, m, h or d")),
    };
    Ok(std::time::Duration::from_secs(seconds))
}

/// `--metadata`: a JSON object, when given.
fn metadata_arg(text: Option<String>) -> CliResult<Option<prost_types::Struct>> {
    match text.as_deref().map(serde_json::from_str) {
        None => Ok(None),
        Some(Ok(serde_json::Value::Object(map))) => Ok(Some(object_to_proto(&map))),
        Some(Ok(_)) => Err(CliError::usage("--metadata must be a JSON object")),
        Some(Err(err)) => Err(CliError::usage(format!(
            "--metadata must be a JSON object: {err}"
        ))),
    }
}

pub(crate) fn session_json(session: &proto::Session) -> serde_json::Value {
    json!({
        "id": session.id,
        "app": session.app,
        "user": session.user,
        "metadata": session.metadata.clone().map(|m| value_json(Some(prost_types::Value {
            kind: Some(prost_types::value::Kind::StructValue(m)),
        }))).unwrap_or_else(|| json!({})),
        "create_time": time(session.create_time.as_ref()),
        "update_time": time(session.update_time.as_ref()),
        "end_time": session.end_time.as_ref().map(|t| time(Some(t))),
        "episode_count": session.episode_count,
        "last_seq": session.last_seq,
        "episodes_evicted": session.episodes_evicted,
    })
}

fn session_line(session: &proto::Session) -> String {
    let ended = if session.end_time.is_some() {
        "  (ended)"
    } else {
        ""
    };
    format!(
        "{}  app={}  user={}  episodes={}  created {}{ended}",
        session.id,
        session.app,
        session.user,
        session.episode_count,
        time(session.create_time.as_ref())
    )
}

fn print_session(output: Output, session: Option<proto::Session>) {
    if let Some(session) = session {
        match output {
            Output::Json => print_json(&session_json(&session)),
            Output::Text => outln!("{}", session_line(&session)),
        }
    }
}

impl SessionsCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        let mut sessions = SessionServiceClient::new(channel);
        match self.command {
            SessionCommand::Create {
                app,
                user,
                id,
                metadata,
                if_missing,
                request_id,
            } => {
                let metadata = metadata_arg(metadata)?;
                let request_id = request_id.or_random();
                let session = if if_missing {
                    sessions
                        .get_or_create_session(proto::GetOrCreateSessionRequest {
                            app,
                            user,
                            session_id: id,
                            metadata,
                            request_id,
                        })
                        .await?
                        .into_inner()
                        .session
                } else {
                    sessions
                        .create_session(proto::CreateSessionRequest {
                            app,
                            user,
                            session_id: id,
                            metadata,
                            request_id,
                        })
                        .await?
                        .into_inner()
                        .session
                };
                print_session(output, session);
            }
            SessionCommand::Get { id, owner } => {
                let session = sessions
                    .get_session(proto::GetSessionRequest {
                        session_id: id,
                        app: owner.app,
                        user: owner.user,
                    })
                    .await?
                    .into_inner()
                    .session;
                print_session(output, session);
            }
            SessionCommand::List { owner } => {
                let all = all_pages(|page_token| {
                    let mut sessions = sessions.clone();
                    let request = proto::ListSessionsRequest {
                        app: owner.app.clone(),
                        user: owner.user.clone(),
                        page_size: 1000,
                        page_token,
                    };
                    async move {
                        let page = sessions.list_sessions(request).await?.into_inner();
                        Ok((page.sessions, page.next_page_token))
                    }
                })
                .await?;
                match output {
                    Output::Json => print_json(&json!({
                        "sessions": all.iter().map(session_json).collect::<Vec<_>>(),
                    })),
                    Output::Text => {
                        for session in &all {
                            outln!("{}", session_line(session));
                        }
                    }
                }
            }
            SessionCommand::Delete { id, owner } => {
                let done = sessions
                    .delete_session(proto::DeleteSessionRequest {
                        session_id: id.clone(),
                        app: owner.app,
                        user: owner.user,
                    })
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "session_id": id,
                        "episodes_deleted": done.episodes_deleted,
                    })),
                    Output::Text => outln!(
                        "deleted session {id} and {}",
                        plural(done.episodes_deleted, "episode", "episodes")
                    ),
                }
            }
            SessionCommand::End {
                id,
                owner,
                delete_episodes,
            } => {
                let done = sessions
                    .end_session(proto::EndSessionRequest {
                        session_id: id,
                        app: owner.app,
                        user: owner.user,
                        delete_episodes,
                    })
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "session": done.session.as_ref().map(session_json),
                        "episodes_deleted": done.episodes_deleted,
                    })),
                    Output::Text => {
                        print_session(output, done.session);
                        if delete_episodes {
                            outln!(
                                "deleted {}",
                                plural(done.episodes_deleted, "episode", "episodes")
                            );
                        }
                    }
                }
            }
            SessionCommand::Cleanup { max_age, dry_run } => {
                let max_age = prost_types::Duration::try_from(max_age)
                    .map_err(|_| CliError::usage("--max-age is too large"))?;
                let done = sessions
                    .cleanup_sessions(proto::CleanupSessionsRequest {
                        max_age: Some(max_age),
                        dry_run,
                    })
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "sessions_deleted": done.sessions_deleted,
                        "dry_run": dry_run,
                    })),
                    Output::Text if dry_run => {
                        outln!(
                            "would delete {}",
                            plural(done.sessions_deleted, "session", "sessions")
                        )
                    }
                    Output::Text => outln!(
                        "deleted {}",
                        plural(done.sessions_deleted, "session", "sessions")
                    ),
                }
            }
            SessionCommand::Stats => {
                let stats = sessions
                    .get_stats(proto::GetStatsRequest {})
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "total_sessions": stats.total_sessions,
                        "total_episodes": stats.total_episodes,
                        "avg_episodes_per_session": stats.avg_episodes_per_session,
                        "sessions_evicted": stats.sessions_evicted,
                        "episodes_evicted": stats.episodes_evicted,
                    })),
                    Output::Text => outln!(
                        "{}, {} ({:.1} per session); evicted: {}, {}",
                        plural(stats.total_sessions, "session", "sessions"),
                        plural(stats.total_episodes, "episode", "episodes"),
                        stats.avg_episodes_per_session,
                        plural(stats.sessions_evicted, "session", "sessions"),
                        plural(stats.episodes_evicted, "episode", "episodes")
                    ),
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct EpisodesCommand {
    #[command(flatten)]
    client: ClientArgs,

    #[command(subcommand)]
    command: EpisodeCommand,
}

#[derive(Debug, clap::Subcommand)]
enum EpisodeCommand {
    /// Append an episode; CONTENT is parsed as JSON when it can be, else a
    /// string. With --app and --user a missing session is created (unless
    /// --require-session).
    Append {
        /// The session to append to
        session_id: String,
        /// The episode's content: JSON, or else the text as a string; `-` reads it from standard input
        content: String,
        /// The event type (user_message, agent_response, tool_call, ...)
        #[arg(long = "type", default_value = "observation")]
        kind: String,
        #[command(flatten)]
        owner: OwnerArgs,
        /// An id that makes retrying this command safe
        #[arg(long, default_value = "", hide_default_value = true)]
        id: String,
        /// The agent that produced it (default: the session's app)
        #[arg(long, default_value = "", hide_default_value = true)]
        agent: String,
        /// A JSON object of attributes
        #[arg(long)]
        metadata: Option<String>,
        /// Append only to a session that exists: a missing one is not created
        /// (exit code 3), even with --app and --user
        #[arg(long)]
        require_session: bool,
    },
    /// Append a file of JSON Lines to a session's log, in batches: one
    /// episode per line, `{"content": …}` with optional `id`, `type`
    /// (default observation), `metadata`, `agent` and `timestamp` (RFC
    /// 3339). A line without an id is given one derived from the session,
    /// its line number and its text, so running the same file again (after
    /// a failure, say) adds only what is missing. `-` reads standard input
    Load {
        /// The session to append to
        session_id: String,
        /// The file of episodes, or `-`
        file: String,
        #[command(flatten)]
        owner: OwnerArgs,
        /// Append only to a session that exists: a missing one is not created
        /// (exit code 3), even with --app and --user
        #[arg(long)]
        require_session: bool,
    },
    /// Print a session's log in seq order (every page)
    List {
        /// The session whose log to print
        session_id: String,
        /// Only these types (repeatable)
        #[arg(long = "type")]
        types: Vec<String>,
        /// Only episodes after this seq
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
        after_seq: i64,
    },
    /// Print one episode by its id (such as a fact's source episode)
    Get {
        /// The episode's id
        id: String,
    },
    /// Print a user's newest episodes, newest first
    Recent {
        /// The user whose episodes to print
        #[arg(long)]
        user: String,
        /// Only this session of the user
        #[arg(long, default_value = "", hide_default_value = true)]
        session_id: String,
        /// Only episodes of this agent
        #[arg(long, default_value = "", hide_default_value = true)]
        agent: String,
        /// How many episodes (1 to 1000)
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i32).range(0..))]
        limit: i32,
        /// Only these types (repeatable)
        #[arg(long = "type")]
        types: Vec<String>,
    },
    /// Print a session's conversation as "User: ... / Assistant: ..." text
    /// (its user_message and agent_response episodes)
    Context {
        /// The session whose conversation to print
        session_id: String,
        /// How many of the newest messages
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i32).range(0..))]
        max_events: i32,
    },
    /// Follow appended episodes until Ctrl-C, then print the cursor to
    /// resume from; when the stream breaks (a server restart, a dropped
    /// connection) it reconnects from the last cursor printed
    Tail {
        /// Only episodes of this session
        #[arg(long, default_value = "", hide_default_value = true)]
        session_id: String,
        /// Only episodes of this user's sessions
        #[arg(long, default_value = "", hide_default_value = true)]
        user: String,
        /// Only episodes of this app's sessions
        #[arg(long, default_value = "", hide_default_value = true)]
        app: String,
        /// Only these types (repeatable)
        #[arg(long = "type")]
        types: Vec<String>,
        /// Replay everything after this cursor first (0: from the start);
        /// without it the tail starts now
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..))]
        cursor: Option<i64>,
        /// Stop after this many episodes
        #[arg(long)]
        limit: Option<usize>,
        /// Stop when the stream breaks instead of reconnecting
        #[arg(long)]
        no_reconnect: bool,
    },
}

pub(crate) fn episode_json(episode: &proto::Episode) -> serde_json::Value {
    json!({
        "id": episode.id,
        "session_id": episode.session_id,
        "seq": episode.seq,
        "cursor": episode.cursor,
        "app": episode.app,
        "user": episode.user,
        "agent": episode.agent,
        "type": episode.r#type,
        "content": value_json(episode.content.clone()),
        "metadata": value_json(episode.metadata.clone().map(|m| prost_types::Value {
            kind: Some(prost_types::value::Kind::StructValue(m)),
        })),
        "source_node": episode.source_node,
        "timestamp": time(episode.timestamp.as_ref()),
        "create_time": time(episode.create_time.as_ref()),
    })
}

pub(crate) fn episode_line(episode: &proto::Episode) -> String {
    format!(
        "#{}  {}/{}  {}  {}  {}  {}",
        episode.cursor,
        episode.session_id,
        episode.seq,
        time(episode.timestamp.as_ref()),
        episode.agent,
        episode.r#type,
        value_json(episode.content.clone())
    )
}

fn print_episodes(output: Output, episodes: &[proto::Episode]) {
    match output {
        Output::Json => print_json(&json!({
            "episodes": episodes.iter().map(episode_json).collect::<Vec<_>>(),
        })),
        Output::Text => {
            for episode in episodes {
                outln!("{}", episode_line(episode));
            }
        }
    }
}

impl EpisodesCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        let mut episodes = EpisodeServiceClient::new(channel.clone());
        match self.command {
            EpisodeCommand::Load {
                session_id,
                file,
                owner,
                require_session,
            } => {
                let text = super::file_or_stdin(file)?;
                let target = super::load::Target {
                    session_id,
                    app: owner.app,
                    user: owner.user,
                    require_session,
                };
                super::load::load(channel, target, &text, output).await?;
            }
            EpisodeCommand::Append {
                session_id,
                content,
                kind,
                owner,
                id,
                agent,
                metadata,
                require_session,
            } => {
                let metadata = metadata_arg(metadata)?;
                let done = episodes
                    .append_episode(proto::AppendEpisodeRequest {
                        session_id,
                        app: owner.app,
                        user: owner.user,
                        episode: Some(proto::NewEpisode {
                            id,
                            agent,
                            r#type: kind,
                            content: Some(json_to_proto(&parse_value(&given_or_stdin(
                                content, false,
                            )?))),
                            metadata,
                            ..proto::NewEpisode::default()
                        }),
                        require_session,
                    })
                    .await?
                    .into_inner();
                if let Some(episode) = done.episode {
                    match output {
                        Output::Json => {
                            let mut value = episode_json(&episode);
                            value["replayed"] = json!(done.replayed);
                            print_json(&value);
                        }
                        Output::Text => outln!("{}", episode_line(&episode)),
                    }
                }
            }
            EpisodeCommand::List {
                session_id,
                types,
                after_seq,
            } => {
                let all = all_pages(|page_token| {
                    let mut episodes = episodes.clone();
                    let request = proto::ListEpisodesRequest {
                        session_id: session_id.clone(),
                        types: types.clone(),
                        after_seq,
                        page_size: 1000,
                        page_token,
                    };
                    async move {
                        let page = episodes.list_episodes(request).await?.into_inner();
                        Ok((page.episodes, page.next_page_token))
                    }
                })
                .await?;
                print_episodes(output, &all);
            }
            EpisodeCommand::Get { id } => {
                let episode = episodes
                    .get_episode(proto::GetEpisodeRequest { id })
                    .await?
                    .into_inner()
                    .episode;
                match (output, episode) {
                    (Output::Json, Some(episode)) => print_json(&episode_json(&episode)),
                    (Output::Text, Some(episode)) => outln!("{}", episode_line(&episode)),
                    (_, None) => {}
                }
            }
            EpisodeCommand::Recent {
                user,
                session_id,
                agent,
                limit,
                types,
            } => {
                let recent = episodes
                    .recent(proto::RecentRequest {
                        user,
                        session_id,
                        agent,
                        limit,
                        types,
                    })
                    .await?
                    .into_inner();
                print_episodes(output, &recent.episodes);
            }
            EpisodeCommand::Context {
                session_id,
                max_events,
            } => {
                let context = episodes
                    .build_context(proto::BuildContextRequest {
                        session_id,
                        max_events,
                    })
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "context": context.context,
                        "events_used": context.events_used,
                    })),
                    // An empty line alone would not say why: the episodes
                    // may all be of other types.
                    Output::Text if context.events_used == 0 => eprintln!(
                        "no messages: a conversation is made of the session's \
                         user_message and agent_response episodes"
                    ),
                    Output::Text => outln!("{}", context.context),
                }
            }
            EpisodeCommand::Tail {
                session_id,
                user,
                app,
                types,
                cursor,
                limit,
                no_reconnect,
            } => {
                let follow = Follow {
                    flag: "--cursor",
                    resume_key: "resume_cursor",
                    reconnect: !no_reconnect,
                    limit,
                };
                let request = |cursor| proto::TailEpisodesRequest {
                    session_id: session_id.clone(),
                    user: user.clone(),
                    app: app.clone(),
                    types: types.clone(),
                    cursor,
                };
                follow
                    .run(
                        cursor,
                        |cursor| {
                            let mut episodes = episodes.clone();
                            let request = request(cursor);
                            async move { episodes.tail_episodes(request).await }
                        },
                        |response: &proto::TailEpisodesResponse| {
                            response.episode.as_ref().map(|e| e.cursor)
                        },
                        |response| {
                            if let Some(episode) = &response.episode {
                                match output {
                                    Output::Json => outln!("{}", episode_json(episode)),
                                    Output::Text => outln!("{}", episode_line(episode)),
                                }
                            }
                        },
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_age;

    #[test]
    fn ages_take_units() {
        assert_eq!(parse_age("90").ok().map(|d| d.as_secs()), Some(90));
        assert_eq!(parse_age("30m").ok().map(|d| d.as_secs()), Some(1800));
        assert_eq!(parse_age("24h").ok().map(|d| d.as_secs()), Some(86_400));
        assert_eq!(parse_age("7d").ok().map(|d| d.as_secs()), Some(604_800));
        assert!(parse_age("1w").is_err());
        assert!(parse_age("h").is_err());
    }
}
