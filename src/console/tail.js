// The live tail of a session page: new episodes arrive as server-sent
// events, already rendered as table rows by the server (escaped there),
// and are appended below the last one. The browser's EventSource sends the
// last event id when it reconnects, so the tail resumes where it was. The
// session's episode count above follows the server's count events.
(function () {
  "use strict";
  var body = document.getElementById("episodes");
  if (!body || body.dataset.live !== "true") { return; }
  var status = document.getElementById("live");
  var count = document.getElementById("episode-count");
  var evicted = document.getElementById("episodes-evicted");
  var url = "/ui/session/tail?id=" + encodeURIComponent(body.dataset.session) +
    "&cursor=" + encodeURIComponent(body.dataset.cursor);
  var source = new EventSource(url);
  source.addEventListener("open", function () {
    if (status) { status.textContent = "Live: new episodes appear as they are appended."; }
  });
  source.addEventListener("error", function () {
    if (status) { status.textContent = "Reconnecting…"; }
  });
  source.addEventListener("episode", function (event) {
    var rows = document.createElement("tbody");
    rows.innerHTML = event.data;
    while (rows.firstChild) {
      var row = rows.firstChild;
      rows.removeChild(row);
      if (row.id && document.getElementById(row.id)) { continue; }
      body.appendChild(row);
    }
  });
  // The session's episode count as the server has it (evictions by the
  // per-session limit included), sent as the tail opens and then at most
  // once a second while episodes arrive.
  source.addEventListener("count", function (event) {
    var now = JSON.parse(event.data);
    if (count) { count.textContent = String(now.count); }
    if (evicted) { evicted.textContent = now.evicted; }
  });
}());
