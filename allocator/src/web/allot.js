// allot's pages: reload a live page now and then (never while a form is being
// filled in), and keep a running workload's output current. Nothing else.
"use strict";
(function () {
  var every = Number(document.body.dataset.refresh || 0);
  if (every > 0) {
    setInterval(function () {
      var a = document.activeElement;
      if (document.visibilityState === "visible" && !(a && (a.tagName === "INPUT" || a.tagName === "BUTTON"))) {
        location.reload();
      }
    }, every * 1000);
  }
  var log = document.getElementById("log");
  if (!log) { return; }
  function read() {
    fetch(log.dataset.log, { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (t) {
        var end = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        log.textContent = t;
        if (end) { log.scrollTop = log.scrollHeight; }
      })
      .catch(function () { log.textContent = "(output could not be read just now)"; });
  }
  read();
  if (log.dataset.live === "1") { setInterval(read, 3000); }
})();
