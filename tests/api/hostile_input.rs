//! Every RPC answers hostile input with a status a client can act on, on
//! both stores: requests generated from the services' own descriptors
//! (every field of every request message, nested ones too, filled or not
//! at random with empty, huge, malformed, SQL-like and Unicode strings,
//! extreme numbers and unknown enum values) get OK or a client error,
//! never INTERNAL, UNKNOWN, DATA_LOSS or UNAVAILABLE, and no message
//! names SQL or the server's source; the server keeps serving after.
//! Every answer given is one protobuf allows: each timestamp in it lies in
//! `google.protobuf.Timestamp`'s range (years 1 to 9999, nanos under a
//! second), which protobuf's JSON mapping, Go's `CheckValid` and Python's
//! `datetime` hold a client to.
//!
//! The requests are encoded here from the descriptors (a raw codec over
//! protobuf's wire format), so one generator reaches every RPC, and a new
//! RPC is covered the day it is added. The console's pages are asked
//! with the same strings in their query parameters, and must not answer
//! with a server error.

use std::collections::HashMap;

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, decode_key, decode_varint, encode_key, encode_varint, skip_field,
};
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;

use crate::helpers::{Backend, TestServer};
use crate::on_both_stores;

/// A message as bytes already encoded, sent as they are; a reply is read
/// into it field by field, as the bytes that encode it, for
/// [`Messages::bad_times`].
#[derive(Clone, Default, PartialEq)]
struct Raw(Vec<u8>);

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl Message for Raw {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        let width = match wire_type {
            WireType::Varint => {
                encode_key(tag, wire_type, &mut self.0);
                encode_varint(decode_varint(buf)?, &mut self.0);
                return Ok(());
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let len = decode_varint(buf)?;
                encode_key(tag, wire_type, &mut self.0);
                encode_varint(len, &mut self.0);
                usize::try_from(len).unwrap_or(usize::MAX)
            }
            // Groups: no Engram message has one.
            _ => return skip_field(wire_type, tag, buf, ctx),
        };
        if buf.remaining() < width {
            // The field runs past the message's end: prost's own error for
            // bytes that end too soon (a varint read from nothing).
            return decode_varint(&mut [].as_slice()).map(drop);
        }
        if !matches!(wire_type, WireType::LengthDelimited) {
            encode_key(tag, wire_type, &mut self.0);
        }
        let mut bytes = vec![0; width];
        buf.copy_to_slice(&mut bytes);
        self.0.extend_from_slice(&bytes);
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Deterministic choices (xorshift).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % n.max(1) as u64).unwrap_or(0)
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}

/// Strings a hostile or careless client sends, and some a careful one
/// does (so that calls get past their first check).
fn string(dice: &mut Dice) -> String {
    const PLAIN: &[&str] = &[
        "",
        " ",
        "a",
        "alice",
        "app",
        "s1",
        "k1",
        "notes/a",
        "ns",
        "observation",
        "deploy to staging",
        "00000000-0000-0000-0000-000000000000",
        "1",
        "-1",
        "2026-11-28T12:00:00Z",
        "0",
        "{\"a\":1}",
        "type = \"observation\"",
        "*/5 * * * *",
        "tool_name",
    ];
    const HOSTILE: &[&str] = &[
        "'; DROP TABLE memory_versions; --",
        "\" OR 1=1 --",
        "%",
        "_",
        "\\",
        "../../etc/passwd",
        "\u{0}",
        "a\u{0}b",
        "\u{202e}evil",
        "😀",
        "第3.5章",
        "e\u{301}",
        "<script>alert(1)</script>",
        "&amp;&#0;&#x110000;",
        "\"unterminated",
        "-",
        "-\"\"",
        "((((",
        "NaN",
        "9999999999999999999999",
        "\u{feff}",
        "\r\n",
        "İ",
    ];
    match dice.below(10) {
        0..=3 => (*dice.pick(PLAIN)).to_owned(),
        4..=6 => (*dice.pick(HOSTILE)).to_owned(),
        7 => dice.pick(PLAIN).repeat(1 + dice.below(3000)),
        8 => {
            // Any characters, now and then more than an index entry holds.
            let n = match dice.chance(20) {
                true => 700 + dice.below(1000),
                false => dice.below(40),
            };
            (0..n)
                .map(|_| {
                    char::from_u32(u32::try_from(dice.below(0x11_0000)).unwrap_or(0))
                        .unwrap_or('\u{fffd}')
                })
                .collect()
        }
        _ => format!("{}{}", dice.pick(PLAIN), dice.pick(HOSTILE)),
    }
}

fn integer(dice: &mut Dice) -> i64 {
    *dice.pick(&[
        0,
        1,
        2,
        10,
        100,
        101,
        1_000,
        -1,
        -100,
        i64::from(i32::MAX),
        i64::from(i32::MIN),
        i64::MAX,
        i64::MIN,
        1_764_000_000,
    ])
}

/// The request messages of the Engram protos by full name
/// (`.engram.v1.SetRequest`), nested types included.
struct Messages(HashMap<String, DescriptorProto>);

impl Messages {
    fn load(set: &FileDescriptorSet) -> Messages {
        fn add(
            into: &mut HashMap<String, DescriptorProto>,
            scope: &str,
            message: &DescriptorProto,
        ) {
            let name = format!("{scope}.{}", message.name());
            for nested in &message.nested_type {
                add(into, &name, nested);
            }
            into.insert(name, message.clone());
        }
        let mut all = HashMap::new();
        for file in &set.file {
            for message in &file.message_type {
                add(&mut all, &format!(".{}", file.package()), message);
            }
        }
        Messages(all)
    }

    /// A message of type `name`, encoded, each field filled or not at
    /// random; nested messages to `depth` levels. A timestamp or a
    /// duration gets seconds and nanos of any size; another message type
    /// not in the set (a well-known type) is left empty, which is valid.
    fn encode(&self, name: &str, dice: &mut Dice, depth: usize, out: &mut Vec<u8>) {
        if matches!(
            name,
            ".google.protobuf.Timestamp" | ".google.protobuf.Duration"
        ) {
            encode_key(1, WireType::Varint, out);
            encode_varint(*dice.pick(TIMES) as u64, out);
            encode_key(2, WireType::Varint, out);
            encode_varint(
                *dice.pick(&[0i64, 999_999_999, 1_000_000_000, -1]) as u64,
                out,
            );
            return;
        }
        let Some(message) = self.0.get(name) else {
            return;
        };
        for field in &message.field {
            if !dice.chance(70) {
                continue;
            }
            let repeats = match field.label() {
                Label::Repeated => dice.below(4),
                _ => 1,
            };
            let tag = u32::try_from(field.number()).unwrap_or(1);
            for _ in 0..repeats {
                match field.r#type() {
                    Type::String | Type::Bytes => {
                        let text = string(dice);
                        encode_key(tag, WireType::LengthDelimited, out);
                        encode_varint(text.len() as u64, out);
                        out.put_slice(text.as_bytes());
                    }
                    Type::Message => {
                        if depth == 0 {
                            continue;
                        }
                        let mut inner = Vec::new();
                        self.encode(field.type_name(), dice, depth - 1, &mut inner);
                        encode_key(tag, WireType::LengthDelimited, out);
                        encode_varint(inner.len() as u64, out);
                        out.put_slice(&inner);
                    }
                    Type::Bool => {
                        encode_key(tag, WireType::Varint, out);
                        encode_varint(u64::from(dice.chance(50)), out);
                    }
                    Type::Enum => {
                        let value: i64 = *dice.pick(&[0, 1, 2, 3, 4, 99, -1]);
                        encode_key(tag, WireType::Varint, out);
                        encode_varint(value as u64, out);
                    }
                    Type::Double => {
                        let value: f64 =
                            *dice.pick(&[0.0, 0.5, -1.0, f64::NAN, f64::INFINITY, 1e308]);
                        encode_key(tag, WireType::SixtyFourBit, out);
                        out.put_f64_le(value);
                    }
                    Type::Float => {
                        let value: f32 = *dice.pick(&[0.0, 0.5, -1.0, f32::NAN, f32::INFINITY]);
                        encode_key(tag, WireType::ThirtyTwoBit, out);
                        out.put_f32_le(value);
                    }
                    Type::Sint32 | Type::Sint64 => {
                        let value = integer(dice);
                        encode_key(tag, WireType::Varint, out);
                        encode_varint(((value << 1) ^ (value >> 63)) as u64, out);
                    }
                    Type::Fixed64 | Type::Sfixed64 => {
                        encode_key(tag, WireType::SixtyFourBit, out);
                        out.put_i64_le(integer(dice));
                    }
                    Type::Fixed32 | Type::Sfixed32 => {
                        encode_key(tag, WireType::ThirtyTwoBit, out);
                        out.put_i32_le(integer(dice) as i32);
                    }
                    // int32, int64, uint32, uint64: varints (a negative
                    // int32 sign-extended, as protobuf sends it).
                    _ => {
                        encode_key(tag, WireType::Varint, out);
                        encode_varint(integer(dice) as u64, out);
                    }
                }
            }
        }
    }
}

/// Seconds a timestamp or duration is sent with: now, the edges of
/// `google.protobuf.Timestamp`'s range and a second past each, and
/// extremes.
const TIMES: &[i64] = &[
    1_764_000_000,
    0,
    -1,
    -62_135_596_800,
    -62_135_596_801,
    253_402_300_799,
    253_402_300_800,
    1 << 40,
    i64::MAX,
    i64::MIN,
];

impl Messages {
    /// Each timestamp in `bytes` (a message of type `name`) that protobuf
    /// does not allow, by the path of fields that holds it; `seen` counts
    /// every timestamp read.
    fn bad_times(
        &self,
        name: &str,
        mut bytes: &[u8],
        at: &str,
        seen: &mut usize,
        out: &mut Vec<String>,
    ) {
        let Some(message) = self.0.get(name) else {
            return;
        };
        while !bytes.is_empty() {
            let Ok((tag, wire_type)) = decode_key(&mut bytes) else {
                out.push(format!("{at}: a field that does not decode"));
                return;
            };
            let field = message
                .field
                .iter()
                .find(|f| u32::try_from(f.number()).ok() == Some(tag));
            if !matches!(wire_type, WireType::LengthDelimited) {
                if skip_field(wire_type, tag, &mut bytes, DecodeContext::default()).is_err() {
                    out.push(format!("{at}: a field that does not decode"));
                    return;
                }
                continue;
            }
            let inner = match decode_varint(&mut bytes) {
                Ok(len) if usize::try_from(len).is_ok_and(|len| len <= bytes.len()) => {
                    let (inner, rest) = bytes.split_at(len as usize);
                    bytes = rest;
                    inner
                }
                _ => {
                    out.push(format!("{at}: a field that does not decode"));
                    return;
                }
            };
            let Some(field) = field.filter(|f| f.r#type() == Type::Message) else {
                continue;
            };
            let path = format!("{at}.{}", field.name());
            if field.type_name() == ".google.protobuf.Timestamp" {
                *seen += 1;
                let (seconds, nanos) = timestamp(inner);
                let in_range = (-62_135_596_800..=253_402_300_799).contains(&seconds);
                if !in_range || !(0..1_000_000_000).contains(&nanos) {
                    out.push(format!("{path}: {seconds} s {nanos} ns"));
                }
            } else {
                self.bad_times(field.type_name(), inner, &path, seen, out);
            }
        }
    }
}

/// A timestamp's seconds and nanos (both varints; zero when absent).
fn timestamp(mut bytes: &[u8]) -> (i64, i64) {
    let (mut seconds, mut nanos) = (0, 0);
    while let Ok((tag, wire_type)) = decode_key(&mut bytes) {
        match (tag, wire_type, decode_varint(&mut bytes)) {
            (1, WireType::Varint, Ok(v)) => seconds = v as i64,
            // An int32: sent sign-extended to ten bytes.
            (2, WireType::Varint, Ok(v)) => nanos = i64::from(v as i32),
            _ => break,
        }
    }
    (seconds, nanos)
}

/// One RPC: its path, request and reply types, and whether it streams.
struct Rpc {
    path: String,
    input: String,
    output: String,
    server_streams: bool,
    client_streams: bool,
}

fn rpcs(set: &FileDescriptorSet) -> Vec<Rpc> {
    let mut all = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                all.push(Rpc {
                    path: format!("/{}.{}/{}", file.package(), service.name(), method.name()),
                    input: method.input_type().to_owned(),
                    output: method.output_type().to_owned(),
                    server_streams: method.server_streaming(),
                    client_streams: method.client_streaming(),
                });
            }
        }
    }
    all
}

/// What no client error may say: SQL, the stores' internals, the
/// server's source.
const LEAKS: &[&str] = &[
    "sqlx",
    "SQL",
    "syntax error",
    "violates",
    "relation \"",
    "column \"",
    "pg_",
    "sqlite",
    "SQLITE",
    ".rs:",
    "panicked",
    "src/",
];

/// The code and message of one call of `rpc` with `request`, and the
/// replies, reading a server stream to its end (but not a watch or a
/// tail, which never ends: their first answer is the status that
/// matters).
async fn call(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    rpc: &Rpc,
    request: Vec<u8>,
) -> (Code, String, Vec<Vec<u8>>) {
    let path = PathAndQuery::try_from(rpc.path.as_str()).expect("path");
    let codec = tonic_prost::ProstCodec::<Raw, Raw>::default();
    if let Err(err) = grpc.ready().await {
        return (Code::Unavailable, err.to_string(), Vec::new());
    }
    let outcome: Result<Vec<Vec<u8>>, tonic::Status> = if rpc.client_streams {
        let stream = tokio_stream::iter([Raw(request)]);
        grpc.client_streaming(tonic::Request::new(stream), path, codec)
            .await
            .map(|reply| vec![reply.into_inner().0])
    } else if rpc.server_streams {
        match grpc
            .server_streaming(tonic::Request::new(Raw(request)), path, codec)
            .await
        {
            Ok(response) => {
                let endless = rpc.path.ends_with("/Watch") || rpc.path.ends_with("/TailEpisodes");
                let mut stream = response.into_inner();
                if endless {
                    return (Code::Ok, String::new(), Vec::new());
                }
                let mut replies = Vec::new();
                loop {
                    match stream.message().await {
                        Ok(Some(reply)) => replies.push(reply.0),
                        Ok(None) => break Ok(replies),
                        Err(status) => break Err(status),
                    }
                }
            }
            Err(status) => Err(status),
        }
    } else {
        grpc.unary(tonic::Request::new(Raw(request)), path, codec)
            .await
            .map(|reply| vec![reply.into_inner().0])
    };
    match outcome {
        Ok(replies) => (Code::Ok, String::new(), replies),
        Err(status) => (status.code(), status.message().to_owned(), Vec::new()),
    }
}

async fn every_rpc_answers_hostile_input_with_a_client_status(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let set = FileDescriptorSet::decode(engram::proto::FILE_DESCRIPTOR_SET).expect("descriptors");
    let messages = Messages::load(&set);
    let rpcs = rpcs(&set);
    assert!(rpcs.len() > 50, "only {} RPCs", rpcs.len());
    let mut grpc = tonic::client::Grpc::new(server.channel.clone());
    let mut dice = Dice(0x9e37_79b9_7f4a_7c15);
    let mut wrong = Vec::new();
    let mut answered: HashMap<Code, usize> = HashMap::new();
    let mut times_seen = 0;
    for round in 0..150 {
        for rpc in &rpcs {
            let mut request = Vec::new();
            messages.encode(&rpc.input, &mut dice, 3, &mut request);
            let size = request.len();
            let (code, message, replies) = call(&mut grpc, rpc, request).await;
            *answered.entry(code).or_default() += 1;
            let mut bad_times = Vec::new();
            for reply in &replies {
                messages.bad_times(&rpc.output, reply, "", &mut times_seen, &mut bad_times);
            }
            for bad in bad_times {
                wrong.push(format!("round {round} {}: answered with {bad}", rpc.path));
            }
            let bad_code = matches!(
                code,
                Code::Internal | Code::Unknown | Code::DataLoss | Code::Unavailable
            );
            let leak = LEAKS.iter().find(|l| message.contains(*l));
            if bad_code || leak.is_some() {
                wrong.push(format!(
                    "round {round} {} ({size} bytes): {code:?} {message:?}",
                    rpc.path
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong answers:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // Both kinds of answer were reached: calls that passed their checks
    // and calls that failed them.
    assert!(
        answered.get(&Code::Ok).copied().unwrap_or(0) > 100,
        "{answered:?}"
    );
    assert!(
        answered.get(&Code::InvalidArgument).copied().unwrap_or(0) > 100,
        "{answered:?}"
    );
    // And the answers' timestamps were read, not passed over.
    assert!(times_seen > 100, "{times_seen} timestamps read");
    // And the server still serves.
    let mut memory = server.memory();
    memory
        .set(engram::proto::SetRequest {
            scope_type: engram::proto::ScopeType::Namespace as i32,
            scope: "after".into(),
            key: "k".into(),
            value: Some(engram::api::convert::json_to_proto(&serde_json::json!(
                "still here"
            ))),
            ..engram::proto::SetRequest::default()
        })
        .await
        .expect("a set after the rest");
}

/// What the generated requests found, each asked once by name: a NUL in a
/// query or a fact's text, a subject longer than Postgres indexes, a
/// duration of `i64::MIN` seconds (which panicked in prost-types), and a
/// long value quoted back in an error, which took the status past what
/// a client reads in its headers (it saw an HTTP/2 protocol error).
async fn hostile_values_found_so_far_are_client_errors(backend: Backend) {
    use engram::proto::search_service_client::SearchServiceClient;
    use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
    use engram::proto::{CleanupSessionsRequest, RememberRequest, SearchRequest};

    let server = TestServer::spawn(backend).await;
    let mut search = SearchServiceClient::new(server.channel.clone());
    let status = search
        .search(SearchRequest {
            query: "deploy \u{0}x".into(),
            ..SearchRequest::default()
        })
        .await
        .expect_err("a NUL in a query");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(crate::helpers::reason(&status), "INVALID_QUERY");

    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    let remember = |subject: String, content: &str| RememberRequest {
        session_id: "s1".into(),
        app: "app".into(),
        user: "alice".into(),
        content: content.into(),
        subject,
        predicate: "prefers".into(),
        object: "dark mode".into(),
        request_id: String::new(),
    };
    // An incompressible subject past an index entry's size.
    let long: String = (0..1500u32)
        .map(|i| char::from_u32(0x4e00 + (i * 7919) % 20_000).unwrap_or('x'))
        .collect();
    for (request, field, reason) in [
        (remember(long, "likes it"), "subject", "VALUE_TOO_LARGE"),
        (
            remember("a\u{0}b".into(), "likes it"),
            "subject",
            "INVALID_ARGUMENT",
        ),
        (
            remember("alice".into(), "likes\u{0}it"),
            "content",
            "INVALID_ARGUMENT",
        ),
    ] {
        let status = working.remember(request).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(crate::helpers::reason(&status), reason, "{status:?}");
        assert!(status.message().starts_with(field), "{status:?}");
    }
    working
        .remember(remember("alice".into(), "likes it"))
        .await
        .expect("a fact within the bounds");

    let status = server
        .sessions()
        .cleanup_sessions(CleanupSessionsRequest {
            max_age: Some(prost_types::Duration {
                seconds: i64::MIN,
                nanos: 5,
            }),
            dry_run: true,
        })
        .await
        .expect_err("an impossible duration");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("max_age"), "{status:?}");

    // A tool name of 6,000 characters is an error the model reads, which
    // quotes only the name's start.
    let called = working
        .call_tool(engram::proto::CallToolRequest {
            session_id: "s1".into(),
            app: "app".into(),
            user: "alice".into(),
            name: "工".repeat(6000),
            ..engram::proto::CallToolRequest::default()
        })
        .await
        .expect("a tool error is a result")
        .into_inner();
    assert!(called.is_error);
    let error = called
        .result
        .map(|r| {
            engram::api::convert::json_from_proto(prost_types::Value {
                kind: Some(prost_types::value::Kind::StructValue(r)),
            })
        })
        .and_then(Result::ok)
        .and_then(|r| r["error"].as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(error.starts_with("unknown tool \"工工"), "{error}");
    assert!(error.contains("…\"; the tools are"), "{error}");
    assert!(error.len() < 500, "{}", error.len());

    // An episode type of 6,000 characters is refused, and the status,
    // which quotes it, quotes at most a kilobyte of it.
    let status = server
        .episodes()
        .recent(engram::proto::RecentRequest {
            user: "alice".into(),
            types: vec!["工".repeat(6000)],
            ..engram::proto::RecentRequest::default()
        })
        .await
        .expect_err("a type past its bound");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().len() <= 1024, "{}", status.message().len());
    assert!(status.message().ends_with('…'), "{}", status.message());
}

/// Times a request gives are ones protobuf allows (years 1 to 9999 UTC,
/// nanos under a second), found by generated requests whose replies were
/// read as JSON: an episode timestamped in the year 36812 was stored and
/// sent back, and then no listing holding it could be printed as JSON or
/// read by the Python client (whose `datetime` ends at 9999). The
/// range's edges are kept, to the microsecond the stores keep.
async fn times_outside_protobufs_range_are_refused(backend: Backend) {
    use engram::api::convert::json_to_proto;
    use engram::proto::consolidation_service_client::ConsolidationServiceClient;
    use engram::proto::memory_delta::Delta;
    use engram::proto::search_service_client::SearchServiceClient;
    use engram::proto::{
        AddDelta, AppendEpisodeRequest, ApplyDeltasRequest, DeltaProvenance, FactPayload,
        ListEpisodesRequest, MemoryDelta, NewEpisode, SearchRequest,
    };
    use prost_types::Timestamp;

    let server = TestServer::spawn(backend).await;
    let mut episodes = server.episodes();
    let at = |seconds, nanos| Some(Timestamp { seconds, nanos });
    let append = |timestamp| AppendEpisodeRequest {
        session_id: "s-times".into(),
        app: "app".into(),
        user: "alice".into(),
        episode: Some(NewEpisode {
            r#type: "observation".into(),
            content: Some(json_to_proto(&serde_json::json!("deploy"))),
            timestamp,
            ..NewEpisode::default()
        }),
        require_session: false,
    };
    for (timestamp, what) in [
        (at(1 << 40, 0), "the year 36812"),
        (at(253_402_300_800, 0), "a second past 9999"),
        (at(-62_135_596_801, 0), "a second before the year 1"),
        (at(1_700_000_059, 1_500_000_000), "a leap second's nanos"),
        (at(1_700_000_000, -1), "negative nanos"),
    ] {
        let status = episodes
            .append_episode(append(timestamp))
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert_eq!(
            crate::helpers::bad_fields(&status),
            ["episode.timestamp"],
            "{what}"
        );
    }
    let edges = [at(-62_135_596_800, 0), at(253_402_300_799, 999_999_000)];
    for edge in edges {
        let episode = episodes
            .append_episode(append(edge))
            .await
            .expect("a time at the range's edge")
            .into_inner()
            .episode
            .expect("the episode");
        assert_eq!(episode.timestamp, edge);
    }
    let listed: Vec<_> = episodes
        .list_episodes(ListEpisodesRequest {
            session_id: "s-times".into(),
            ..ListEpisodesRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .episodes
        .into_iter()
        .map(|e| e.timestamp)
        .collect();
    assert_eq!(listed, edges, "only the edges were stored");

    let mut search = SearchServiceClient::new(server.channel.clone());
    let status = search
        .search(SearchRequest {
            query: "deploy".into(),
            start_time: at(1 << 40, 0),
            ..SearchRequest::default()
        })
        .await
        .expect_err("a filter past 9999");
    assert_eq!(crate::helpers::bad_fields(&status), ["start_time"]);

    let mut rules = ConsolidationServiceClient::new(server.channel.clone());
    let status = rules
        .apply_deltas(ApplyDeltasRequest {
            deltas: vec![MemoryDelta {
                delta: Some(Delta::Add(AddDelta {
                    fact_payload: Some(FactPayload {
                        app: "app".into(),
                        user: "alice".into(),
                        content: Some(json_to_proto(&serde_json::json!("likes coffee"))),
                        ..FactPayload::default()
                    }),
                    provenance: Some(DeltaProvenance {
                        promotion_ts: at(-1 << 40, 0),
                        ..crate::consolidation::provenance(&["e1"])
                    }),
                })),
            }],
        })
        .await
        .expect_err("a promotion before the year 1");
    assert_eq!(
        crate::helpers::bad_fields(&status),
        ["deltas[0].add.provenance.promotion_ts"]
    );

    // The longest age protobuf allows (10,000 years) reaches before the
    // year 1: nothing is that old. Postgres, whose first time is 4713 BC,
    // had answered INTERNAL.
    let mut sessions = server.sessions();
    let deleted = sessions
        .cleanup_sessions(engram::proto::CleanupSessionsRequest {
            max_age: Some(prost_types::Duration {
                seconds: 315_576_000_000,
                nanos: 0,
            }),
            dry_run: false,
        })
        .await
        .expect("the longest age")
        .into_inner()
        .sessions_deleted;
    assert_eq!(deleted, 0);
    sessions
        .get_session(engram::proto::GetSessionRequest {
            session_id: "s-times".into(),
            ..engram::proto::GetSessionRequest::default()
        })
        .await
        .expect("the session stays");
}

/// A JSON value a request carries (a memory value, an episode's content
/// and metadata, a session's metadata, a fact's content, a tool's
/// arguments) that JSON cannot hold is refused by its own field's path, so
/// a client knows which of its values to fix: a fact's content and a
/// tool's arguments were once reported as `value`.
async fn json_values_are_refused_by_their_own_field(backend: Backend) {
    use engram::proto::consolidation_service_client::ConsolidationServiceClient;
    use engram::proto::memory_delta::Delta;
    use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
    use engram::proto::{
        AddDelta, AppendEpisodeRequest, AppendEpisodesRequest, ApplyDeltasRequest, CallToolRequest,
        CreateSessionRequest, FactPayload, MemoryDelta, NewEpisode, ScopeType, SetRequest,
        UpdateDelta,
    };
    use prost_types::value::Kind;
    use prost_types::{Struct, Value};

    let server = TestServer::spawn(backend).await;
    let nan = || Value {
        kind: Some(Kind::NumberValue(f64::NAN)),
    };
    let null = || {
        Some(Value {
            kind: Some(Kind::NullValue(0)),
        })
    };
    let holding_nan = || {
        Some(Struct {
            fields: [("score".to_owned(), nan())].into(),
        })
    };
    let expect_field = |status: tonic::Status, field: &str| {
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert_eq!(crate::helpers::bad_fields(&status), [field], "{status:?}");
    };
    server
        .sessions()
        .create_session(CreateSessionRequest {
            app: "app".into(),
            user: "alice".into(),
            session_id: "s1".into(),
            metadata: None,
            request_id: String::new(),
        })
        .await
        .expect("session");

    let status = server
        .memory()
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "team".into(),
            key: "k".into(),
            value: Some(nan()),
            ..SetRequest::default()
        })
        .await
        .expect_err("NaN value");
    expect_field(status, "value");

    let status = server
        .sessions()
        .create_session(CreateSessionRequest {
            app: "app".into(),
            user: "alice".into(),
            session_id: "s2".into(),
            metadata: holding_nan(),
            request_id: String::new(),
        })
        .await
        .expect_err("NaN metadata");
    expect_field(status, "metadata.score");

    let episode = |content: Option<Value>, metadata: Option<Struct>| NewEpisode {
        r#type: "message".into(),
        content,
        metadata,
        ..NewEpisode::default()
    };
    let append = |new: NewEpisode| AppendEpisodeRequest {
        session_id: "s1".into(),
        episode: Some(new),
        ..AppendEpisodeRequest::default()
    };
    let mut episodes = server.episodes();
    let status = episodes
        .append_episode(append(episode(Some(nan()), None)))
        .await
        .expect_err("NaN content");
    expect_field(status, "episode.content");
    let status = episodes
        .append_episode(append(episode(null(), holding_nan())))
        .await
        .expect_err("NaN metadata");
    expect_field(status, "episode.metadata.score");
    let status = episodes
        .append_episodes(AppendEpisodesRequest {
            session_id: "s1".into(),
            episodes: vec![episode(null(), None), episode(Some(nan()), None)],
            ..AppendEpisodesRequest::default()
        })
        .await
        .expect_err("NaN content in a batch");
    expect_field(status, "episodes[1].content");

    let payload = || FactPayload {
        app: "app".into(),
        user: "alice".into(),
        content: Some(nan()),
        ..FactPayload::default()
    };
    let mut consolidation = ConsolidationServiceClient::new(server.channel.clone());
    for (delta, field) in [
        (
            Delta::Add(AddDelta {
                fact_payload: Some(payload()),
                provenance: Some(crate::consolidation::provenance(&["e1"])),
            }),
            "deltas[0].add.fact_payload.content",
        ),
        (
            Delta::Update(UpdateDelta {
                fact_payload: Some(payload()),
                replaces: vec!["f1".into()],
                provenance: Some(crate::consolidation::provenance(&["e1"])),
            }),
            "deltas[0].update.fact_payload.content",
        ),
    ] {
        let status = consolidation
            .apply_deltas(ApplyDeltasRequest {
                deltas: vec![MemoryDelta { delta: Some(delta) }],
            })
            .await
            .expect_err("NaN fact content");
        expect_field(status, field);
    }

    let status = WorkingMemoryServiceClient::new(server.channel.clone())
        .call_tool(CallToolRequest {
            session_id: "s1".into(),
            name: "Remember".into(),
            arguments: Some(Value {
                kind: Some(Kind::StructValue(holding_nan().unwrap_or_default())),
            }),
            ..CallToolRequest::default()
        })
        .await
        .expect_err("NaN arguments");
    expect_field(status, "arguments");
}

on_both_stores!(
    json_values_are_refused_by_their_own_field,
    every_rpc_answers_hostile_input_with_a_client_status,
    times_outside_protobufs_range_are_refused,
    hostile_values_found_so_far_are_client_errors,
    console_pages_answer_hostile_queries_without_a_server_error,
);

/// Percent-encodes every byte but the unreserved ones, for a query string.
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The console's pages, asked with hostile query strings (every parameter
/// any page reads, each present or not, with the strings above and
/// numbers out of range), answer as pages do, never with a server error,
/// and never show SQL or the server's source.
async fn console_pages_answer_hostile_queries_without_a_server_error(backend: Backend) {
    const PAGES: &[&str] = &[
        "/ui/",
        "/ui/scope",
        "/ui/key",
        "/ui/log",
        "/ui/export",
        "/ui/sessions",
        "/ui/session",
        "/ui/rules",
        "/ui/facts",
        "/ui/fact",
        "/ui/episode",
        "/ui/search",
    ];
    const PARAMS: &[&str] = &[
        "type", "scope", "prefix", "page", "key", "a", "b", "id", "app", "user", "q", "source",
        "session", "after", "cursor",
    ];
    let server = TestServer::spawn(backend).await;
    let mut dice = Dice(0x2545_f491_4f6c_dd1d);
    let mut wrong = Vec::new();
    let mut ok = 0;
    for _ in 0..40 {
        for page in PAGES {
            let mut query = Vec::new();
            for name in PARAMS {
                if !dice.chance(40) {
                    continue;
                }
                let value = match dice.chance(30) {
                    true => integer(&mut dice).to_string(),
                    // A URL's length is bounded; a few hundred characters.
                    false => string(&mut dice).chars().take(400).collect(),
                };
                query.push(format!("{name}={}", percent(&value)));
            }
            let path = format!("{page}?{}", query.join("&"));
            let (status, _, body) = crate::helpers::http_get(server.http_addr(), &path, None).await;
            let body = String::from_utf8_lossy(&body);
            let leak = LEAKS.iter().find(|l| body.contains(*l));
            // A refusal is the console's own page, never the web
            // framework's plain-text rejection of a query it cannot read.
            let bare = status >= 400 && !body.starts_with("<!DOCTYPE html>");
            if status >= 500 || leak.is_some() || bare {
                let start: String = body.chars().take(80).collect();
                wrong.push(format!("{path}: {status} {leak:?} {start}"));
            }
            ok += usize::from(status == 200);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong answers:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(ok > 50, "only {ok} pages shown");
}
