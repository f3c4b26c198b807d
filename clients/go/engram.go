// Package engram is a thin Go client for Engram, durable memory for AI
// agents served over gRPC.
//
// The generated stubs for every service live in the engramv1 package and
// are fields of Client. This package adds what every caller needs: bearer
// tokens and caller context on every call, errors that carry the server's
// stable reason (see AsError), retries of idempotent calls after
// UNAVAILABLE (see WithRetries), a key's history read on after a broken
// stream (see Client.AllVersions), and tail and watch iterators that
// resume from the last cursor or revision after a disconnect (see
// Client.Tail and Client.Watch).
package engram

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"engram.dev/engram/clients/go/engramv1"
)

// CallerContext travels as metadata with every call: the run and flow making
// it.
type CallerContext struct {
	ExecutionID string
	FlowID      string
	FlowName    string
}

type options struct {
	token        string
	tls          *tls.Config
	caller       CallerContext
	dialing      []grpc.DialOption
	retries      int
	observeRetry func(Retry)
}

// Option configures a Client.
type Option func(*options)

// WithToken sends a bearer token with every call.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLS connects with TLS (plaintext otherwise).
func WithTLS(config *tls.Config) Option { return func(o *options) { o.tls = config } }

// WithCallerContext sets the execution and flow sent with every call.
func WithCallerContext(caller CallerContext) Option {
	return func(o *options) { o.caller = caller }
}

// WithDialOptions passes options through to grpc.NewClient.
func WithDialOptions(dialing ...grpc.DialOption) Option {
	return func(o *options) { o.dialing = append(o.dialing, dialing...) }
}

// Client is a connection to an Engram server with a stub per service.
type Client struct {
	conn          *grpc.ClientConn
	options       *options
	Memory        engramv1.MemoryServiceClient
	MemoryAdmin   engramv1.MemoryAdminServiceClient
	Sessions      engramv1.SessionServiceClient
	Episodes      engramv1.EpisodeServiceClient
	Consolidation engramv1.ConsolidationServiceClient
	WorkingMemory engramv1.WorkingMemoryServiceClient
	SearchService engramv1.SearchServiceClient
	Data          engramv1.DataServiceClient
}

// New connects to target ("host:port"); the connection is made lazily.
func New(target string, opts ...Option) (*Client, error) {
	o := options{retries: DefaultRetries}
	for _, opt := range opts {
		opt(&o)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	pairs := []string{}
	for key, value := range map[string]string{
		"engram-execution-id": o.caller.ExecutionID,
		"engram-flow-id":      o.caller.FlowID,
		"engram-flow-name":    o.caller.FlowName,
	} {
		if value != "" {
			pairs = append(pairs, key, value)
		}
	}
	if o.token != "" {
		pairs = append(pairs, "authorization", "Bearer "+o.token)
	}
	withMetadata := func(ctx context.Context) context.Context {
		if len(pairs) == 0 {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, pairs...)
	}
	dialing := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
			return invoker(withMetadata(ctx), method, req, reply, cc, callOpts...)
		}, retrying(&o)),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc,
			cc *grpc.ClientConn, method string, streamer grpc.Streamer,
			callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withMetadata(ctx), desc, cc, method, callOpts...)
		}),
	}, o.dialing...)
	conn, err := grpc.NewClient(target, dialing...)
	if err != nil {
		return nil, err
	}
	return &Client{
		conn:          conn,
		options:       &o,
		Memory:        engramv1.NewMemoryServiceClient(conn),
		MemoryAdmin:   engramv1.NewMemoryAdminServiceClient(conn),
		Sessions:      engramv1.NewSessionServiceClient(conn),
		Episodes:      engramv1.NewEpisodeServiceClient(conn),
		Consolidation: engramv1.NewConsolidationServiceClient(conn),
		WorkingMemory: engramv1.NewWorkingMemoryServiceClient(conn),
		SearchService: engramv1.NewSearchServiceClient(conn),
		Data:          engramv1.NewDataServiceClient(conn),
	}, nil
}

// Search finds memory entries, facts and episodes by what they say, best
// first: words are alternatives, "quoted phrases" required, -words
// excluded. The request's filters narrow the sources they belong to.
func (c *Client) Search(ctx context.Context, request *engramv1.SearchRequest) ([]*engramv1.SearchHit, error) {
	response, err := c.SearchService.Search(ctx, request)
	if err != nil {
		return nil, err
	}
	return response.GetHits(), nil
}

// ExportTo writes the tenant, or the part the request chooses (a scope, a
// session, an app's user), to w as JSON Lines, the header first and an end
// line last, as the server streams it; it returns the number of lines
// written. An export that fails part way has written no end line, so what
// w holds is refused by Import rather than imported as the whole.
func (c *Client) ExportTo(ctx context.Context, request *engramv1.ExportRequest, w io.Writer) (int, error) {
	stream, err := c.Data.Export(ctx, request)
	if err != nil {
		return 0, err
	}
	out := bufio.NewWriter(w)
	written := 0
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return written, out.Flush()
		}
		if err != nil {
			return written, err
		}
		for _, line := range chunk.GetLines() {
			if _, err := out.WriteString(line + "\n"); err != nil {
				return written, err
			}
			written++
		}
	}
}

// importBatchBytes is about how many bytes of lines one import message
// carries, well under gRPC's 4 MiB.
const importBatchBytes = 1 << 20

// Import restores an export read from r into the token's tenant, all or
// nothing (an admin token). A read error cancels the call, so a file that
// cannot be read to its end imports nothing.
func (c *Client) Import(ctx context.Context, r io.Reader) (*engramv1.ImportResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Data.Import(ctx)
	if err != nil {
		return nil, err
	}
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 64*1024), 64<<20)
	var batch []string
	size := 0
	for lines.Scan() {
		batch = append(batch, lines.Text())
		size += len(lines.Text())
		if size >= importBatchBytes {
			if err := stream.Send(&engramv1.ImportRequest{Lines: batch}); err != nil {
				_, err = stream.CloseAndRecv()
				return nil, err
			}
			batch, size = nil, 0
		}
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("reading the export: %w", err)
	}
	if len(batch) > 0 {
		if err := stream.Send(&engramv1.ImportRequest{Lines: batch}); err != nil {
			_, err = stream.CloseAndRecv()
			return nil, err
		}
	}
	return stream.CloseAndRecv()
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Error is a failed call with the details the server attached: the stable
// Reason (VERSION_MISMATCH, KEY_NOT_FOUND, ...), the ErrorInfo metadata,
// the invalid request fields, and how long the server asks a retry to wait
// (RetryInfo; 0 when it did not say).
type Error struct {
	Code       codes.Code
	Message    string
	Reason     string
	Metadata   map[string]string
	Fields     map[string]string
	RetryDelay time.Duration
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("%s: %s (%s)", e.Code, e.Message, e.Reason)
}

// AsError decodes a gRPC error into an *Error; false for other errors.
func AsError(err error) (*Error, bool) {
	if err == nil {
		return nil, false
	}
	var engramErr *Error
	if errors.As(err, &engramErr) {
		return engramErr, true
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	out := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, Fields: map[string]string{}}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			out.Reason = d.GetReason()
			for k, v := range d.GetMetadata() {
				out.Metadata[k] = v
			}
		case *errdetails.BadRequest:
			for _, violation := range d.GetFieldViolations() {
				out.Fields[violation.GetField()] = violation.GetDescription()
			}
		case *errdetails.RetryInfo:
			out.RetryDelay = d.GetRetryDelay().AsDuration()
		}
	}
	return out, true
}

// Reason is the stable reason of an error from Engram, or "".
func Reason(err error) string {
	if e, ok := AsError(err); ok {
		return e.Reason
	}
	return ""
}

// follow is a live stream that resumes after a disconnect from the last
// position it delivered: Tail's cursor, Watch's revision.
type follow[R any] struct {
	ctx context.Context
	// open opens the stream from the position now held.
	open func(opts ...grpc.CallOption) (grpc.ServerStreamingClient[R], error)
	// position is a message's position, held (by resume) once received.
	position func(*R) int64
	// started is whether a position is held; resume sets one.
	started func() bool
	resume  func(int64)
	// resumeKey is the ErrorInfo metadata key where a stream that started
	// "now" says where it stood when it broke.
	resumeKey string
	stream    grpc.ServerStreamingClient[R]
	err       error
}

func retryable(err error) bool {
	e, ok := AsError(err)
	if !ok {
		return false
	}
	return e.Code == codes.Unavailable ||
		(e.Code == codes.ResourceExhausted && e.Reason == "CONSUMER_TOO_SLOW")
}

// next waits for the next message; nil when the context ends or an error
// that reconnecting cannot fix occurs (see err).
func (f *follow[R]) next(maxReconnects int) *R {
	failures := 0
	delay := 50 * time.Millisecond
	for {
		if f.stream == nil {
			// After a failure, wait for the server to be reachable again.
			stream, err := f.open(grpc.WaitForReady(failures > 0))
			if err != nil {
				if f.ctx.Err() == nil && retryable(err) && (maxReconnects == 0 || failures < maxReconnects) {
					failures++
					if !f.sleep(&delay) {
						return nil
					}
					continue
				}
				f.err = err
				return nil
			}
			f.stream = stream
		}
		message, err := f.stream.Recv()
		if err == nil {
			f.resume(f.position(message))
			return message
		}
		f.stream = nil
		if e, ok := AsError(err); ok && !f.started() {
			// Started "now" and saw nothing yet: resume where the server
			// says the stream stood.
			var resume int64
			if _, scanErr := fmt.Sscan(e.Metadata[f.resumeKey], &resume); scanErr == nil {
				f.resume(resume)
			}
		}
		if f.ctx.Err() != nil {
			f.err = f.ctx.Err()
			return nil
		}
		if !retryable(err) || (maxReconnects > 0 && failures >= maxReconnects) {
			f.err = err
			return nil
		}
		failures++
		if !f.sleep(&delay) {
			return nil
		}
	}
}

func (f *follow[R]) sleep(delay *time.Duration) bool {
	select {
	case <-time.After(*delay):
		if *delay < 2*time.Second {
			*delay *= 2
		}
		return true
	case <-f.ctx.Done():
		f.err = f.ctx.Err()
		return false
	}
}

// failure is why next returned nil (nil when the stream ended cleanly or
// the context was canceled).
func (f *follow[R]) failure() error {
	if errors.Is(f.err, context.Canceled) || errors.Is(f.err, io.EOF) {
		return nil
	}
	return f.err
}

// Tail follows appended episodes and resumes after a disconnect from the
// last cursor it returned, so the caller sees every episode once, in cursor
// order. Use it like bufio.Scanner:
//
//	tail := client.Tail(ctx, &engramv1.TailEpisodesRequest{App: "bot", Cursor: proto.Int64(0)})
//	for tail.Next() {
//		use(tail.Episode())
//	}
//	err := tail.Err()
type Tail struct {
	follow  follow[engramv1.TailEpisodesResponse]
	request *engramv1.TailEpisodesRequest
	current *engramv1.Episode
	// MaxReconnects bounds consecutive failed reconnects; 0 means no bound.
	MaxReconnects int
}

// Tail opens a tail; it connects on the first Next.
func (c *Client) Tail(ctx context.Context, request *engramv1.TailEpisodesRequest) *Tail {
	t := &Tail{request: request}
	t.follow = follow[engramv1.TailEpisodesResponse]{
		ctx: ctx,
		open: func(opts ...grpc.CallOption) (grpc.ServerStreamingClient[engramv1.TailEpisodesResponse], error) {
			return c.Episodes.TailEpisodes(ctx, t.request, opts...)
		},
		position:  func(r *engramv1.TailEpisodesResponse) int64 { return r.GetEpisode().GetCursor() },
		started:   func() bool { return t.request.Cursor != nil },
		resume:    func(cursor int64) { t.request.Cursor = &cursor },
		resumeKey: "resume_cursor",
	}
	return t
}

// Next waits for the next episode; false when the context ends or an error
// that reconnecting cannot fix occurs (see Err).
func (t *Tail) Next() bool {
	response := t.follow.next(t.MaxReconnects)
	if response == nil {
		return false
	}
	t.current = response.GetEpisode()
	return true
}

// Episode is the episode the last successful Next returned.
func (t *Tail) Episode() *engramv1.Episode { return t.current }

// Cursor is where to resume: the cursor of the last episode returned (or
// the starting cursor).
func (t *Tail) Cursor() int64 { return t.request.GetCursor() }

// Err is why Next returned false (nil when the stream ended cleanly).
func (t *Tail) Err() error { return t.follow.failure() }

// Watch follows a scope's changes in commit order and resumes after a
// disconnect from the last revision it returned, so the caller sees every
// change once. Use it like Tail:
//
//	watch := client.Watch(ctx, &engramv1.WatchRequest{ScopeType: ns, Scope: "prefs", FromRevision: proto.Int64(0)})
//	for watch.Next() {
//		use(watch.Change())
//	}
//	err := watch.Err()
type Watch struct {
	follow  follow[engramv1.WatchResponse]
	request *engramv1.WatchRequest
	current *engramv1.WatchResponse
	// MaxReconnects bounds consecutive failed reconnects; 0 means no bound.
	MaxReconnects int
}

// Watch opens a watch; it connects on the first Next.
func (c *Client) Watch(ctx context.Context, request *engramv1.WatchRequest) *Watch {
	w := &Watch{request: request}
	w.follow = follow[engramv1.WatchResponse]{
		ctx: ctx,
		open: func(opts ...grpc.CallOption) (grpc.ServerStreamingClient[engramv1.WatchResponse], error) {
			return c.Memory.Watch(ctx, w.request, opts...)
		},
		position:  func(r *engramv1.WatchResponse) int64 { return r.GetRevision() },
		started:   func() bool { return w.request.FromRevision != nil },
		resume:    func(revision int64) { w.request.FromRevision = &revision },
		resumeKey: "resume_revision",
	}
	return w
}

// Next waits for the next change; false when the context ends or an error
// that reconnecting cannot fix occurs (see Err).
func (w *Watch) Next() bool {
	w.current = w.follow.next(w.MaxReconnects)
	return w.current != nil
}

// Change is the change the last successful Next returned.
func (w *Watch) Change() *engramv1.WatchResponse { return w.current }

// Revision is where to resume: the revision of the last change returned
// (or the starting revision).
func (w *Watch) Revision() int64 { return w.request.GetFromRevision() }

// Err is why Next returned false (nil when the stream ended cleanly).
func (w *Watch) Err() error { return w.follow.failure() }
