package engram

// Retries of unary calls after UNAVAILABLE, and after failures that wrote
// nothing. Written as an interceptor
// rather than as a gRPC service-config retry policy: such a policy is per
// method, so it cannot retry a Set that carries a request id and refuse
// one that does not, and it ignores the server's RetryInfo.

import (
	"context"
	crand "crypto/rand"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"engram.dev/engram/clients/go/engramv1"
)

// DefaultRetries is how many times a Client retries an idempotent call
// that failed with UNAVAILABLE, unless WithRetries says otherwise.
const DefaultRetries = 3

// The wait before a retry the server gave no delay for: the first, and the
// most; each doubles the last, less up to half at random.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 2 * time.Second
)

// nothingWritten holds the reasons the server fails a call with only when
// nothing of it was written (its transaction was rolled back): a deadlock
// Postgres broke, a session made again under an append, a statement the
// database gave up on. Any call, keyed or not, is retried after them.
var nothingWritten = map[string]bool{
	"TRANSACTION_CONFLICT": true,
	"SESSION_CHANGED":      true,
	"DATABASE_TIMEOUT":     true,
}

// Retry is one retry a Client is about to make: the method, the number of
// the try that failed, how long it waits, and the failure.
type Retry struct {
	Method  string
	Attempt int
	Delay   time.Duration
	Err     error
}

// WithRetries sets how many times an idempotent unary call (see
// Idempotent) is tried again after UNAVAILABLE: a database failover or a
// server restart; and any unary call after a failure whose reason says
// nothing was written (TRANSACTION_CONFLICT, SESSION_CHANGED,
// DATABASE_TIMEOUT). 0 turns retries off. Each retry waits what the server's
// RetryInfo asks, or else a backoff growing from 100 ms to 2 s, then waits
// for the server to be reachable; none starts past the context's deadline.
func WithRetries(n int) Option {
	return func(o *options) { o.retries = max(n, 0) }
}

// WithRetryObserver calls observe before each retry, to log or count them.
func WithRetryObserver(observe func(Retry)) Option {
	return func(o *options) { o.observeRetry = observe }
}

// Idempotent reports whether sending request twice has the effect of
// sending it once: a read, a write that sets state to what it carries (a
// session's goal, a task's fields, a cached file, a session's end, a
// scope's retention, the reindex), or a write that carries its idempotency
// key (a
// request id for Set and Delete, every episode's id for AppendEpisode and
// AppendEpisodes, the request id for CreateSession, CreateRule, CreateTask, Remember,
// RecordProcedure and CallTool (whose TaskUpdate and memory.set_goal need
// none), and the request or session id for
// GetOrCreateSession). Only these are
// retried after UNAVAILABLE, whose write may or may not have happened (a
// commit whose reply was lost).
func Idempotent(request proto.Message) bool {
	switch r := request.(type) {
	case *engramv1.GetRequest, *engramv1.ListRequest, *engramv1.HistoryRequest, *engramv1.ListScopesRequest,
		*engramv1.GetCompactionLogRequest, *engramv1.GetRetentionRequest,
		*engramv1.SearchRequest,
		*engramv1.GetSessionRequest, *engramv1.ListSessionsRequest, *engramv1.GetStatsRequest,
		*engramv1.ListEpisodesRequest, *engramv1.GetEpisodeRequest, *engramv1.RecentRequest,
		*engramv1.BuildContextRequest,
		*engramv1.GetRuleRequest, *engramv1.ListRulesRequest,
		*engramv1.GetFactRequest, *engramv1.ListFactsRequest,
		*engramv1.ListTasksRequest, *engramv1.GetSnapshotRequest,
		*engramv1.RenderMemoryBlockRequest, *engramv1.ListToolsRequest:
		return true
	case *engramv1.SetGoalRequest, *engramv1.UpdateTaskRequest, *engramv1.CacheContentRequest,
		*engramv1.EndSessionRequest, *engramv1.SetRetentionRequest, *engramv1.ReindexRequest:
		// Writes that set state to what they carry: a repeat leaves it as
		// the first left it (its reply describes the repeat: nothing more
		// evicted or deleted).
		return true
	case *engramv1.SetRequest:
		return r.GetRequestId() != ""
	case *engramv1.DeleteRequest:
		return r.GetRequestId() != ""
	case *engramv1.AppendEpisodeRequest:
		return r.GetEpisode().GetId() != ""
	case *engramv1.AppendEpisodesRequest:
		for _, episode := range r.GetEpisodes() {
			if episode.GetId() == "" {
				return false
			}
		}
		return len(r.GetEpisodes()) > 0
	case *engramv1.CreateSessionRequest:
		return r.GetRequestId() != ""
	case *engramv1.CreateRuleRequest:
		return r.GetRequestId() != ""
	case *engramv1.CreateTaskRequest:
		return r.GetRequestId() != ""
	case *engramv1.RememberRequest:
		return r.GetRequestId() != ""
	case *engramv1.RecordProcedureRequest:
		return r.GetRequestId() != ""
	case *engramv1.CallToolRequest:
		switch r.GetName() {
		case "TaskUpdate", "memory.task_update", "memory.set_goal":
			return true // the tools that set what they carry
		}
		return r.GetRequestId() != ""
	case *engramv1.GetOrCreateSessionRequest:
		return r.GetSessionId() != "" || r.GetRequestId() != ""
	}
	return false
}

// withRequestID returns a copy of a request that creates something (a
// session, a rule, a task, a fact; a tool call, which may) and has no request id,
// given a random one; nil
// for any other request. A creation so keyed is retried like any keyed
// write: a retry after a lost reply is answered with what the first try
// made, not with ALREADY_EXISTS, a second one, or created false. The
// caller's message is left as it was.
func withRequestID(request proto.Message) proto.Message {
	switch request.(type) {
	case *engramv1.CreateSessionRequest, *engramv1.GetOrCreateSessionRequest,
		*engramv1.CreateRuleRequest, *engramv1.CreateTaskRequest, *engramv1.RememberRequest, *engramv1.RecordProcedureRequest,
		*engramv1.CallToolRequest:
	default:
		return nil
	}
	field := request.ProtoReflect().Descriptor().Fields().ByName("request_id")
	if field == nil || request.ProtoReflect().Get(field).String() != "" {
		return nil
	}
	keyed := proto.Clone(request)
	keyed.ProtoReflect().Set(field, protoreflect.ValueOfString(crand.Text()))
	return keyed
}

// retrier holds the tries of one call: whether a failure is tried again
// (the rule of WithRetries), and the wait before it.
type retrier struct {
	o          *options
	method     string
	idempotent bool
	backoff    time.Duration
	// failed counts the tries that failed since the call began (for a
	// resumed stream: since it last delivered).
	failed int
	// retried is the failure the last retry was made after: a retry that
	// reached the deadline waiting for an unreachable server answers with
	// it, which says why it waited, rather than with DeadlineExceeded.
	retried error
}

func newRetrier(o *options, method string, request proto.Message) *retrier {
	return &retrier{o: o, method: method, idempotent: Idempotent(request), backoff: firstBackoff}
}

// again reports whether to try again after err; when it does, it has
// waited the delay first. A retry should wait for the server to be
// reachable (grpc.WaitForReady), within the context's deadline.
func (r *retrier) again(ctx context.Context, err error) bool {
	r.failed++
	if r.failed > r.o.retries || ctx.Err() != nil {
		return false
	}
	failure, ok := AsError(err)
	if !ok || !(nothingWritten[failure.Reason] || r.idempotent && failure.Code == codes.Unavailable) {
		return false
	}
	delay := failure.RetryDelay
	if delay <= 0 {
		delay = r.backoff/2 + rand.N(r.backoff/2+1)
		r.backoff = min(r.backoff*2, maxBackoff)
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= delay {
		return false
	}
	r.retried = err
	if r.o.observeRetry != nil {
		r.o.observeRetry(Retry{Method: r.method, Attempt: r.failed, Delay: delay, Err: err})
	}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// progressed says a resumed stream delivered: its next failure is tried
// again as the first would be (WithRetries counts breaks in a row).
func (r *retrier) progressed() {
	r.failed, r.backoff, r.retried = 0, firstBackoff, nil
}

// final is what the call returns after giving up on err.
func (r *retrier) final(err error) error {
	if r.retried != nil && status.Code(err) == codes.DeadlineExceeded {
		return r.retried
	}
	return err
}

// retrying is the interceptor that retries what WithRetries describes.
func retrying(o *options) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if o.retries == 0 {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		message, _ := req.(proto.Message)
		if keyed := withRequestID(message); keyed != nil {
			req, message = keyed, keyed
		}
		tries := newRetrier(o, method, message)
		for {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil {
				return nil
			}
			if tries.failed == 0 {
				// A retry waits for the server to be reachable (a pod
				// restarting), within the context's deadline.
				callOpts = append(callOpts[:len(callOpts):len(callOpts)], grpc.WaitForReady(true))
			}
			if !tries.again(ctx, err) {
				return tries.final(err)
			}
		}
	}
}
