// The presenter view's keys: → / PageDown / Space / N run the next step of the exercise (or,
// after going back, show the following note again); ← / PageUp / B show the previous step's
// note; S shows or hides the SQL. A clicker (presentation remote) sends PageDown and PageUp.
(function () {
  "use strict";
  var back = 0;  // how many notes before the current one the presenter is looking at

  function guide() { return document.getElementById("present-guide"); }

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }

  // Show the note `back` steps before the current one (the next step's, or the last one when done).
  function showNotes() {
    var box = guide();
    if (!box) return;
    var notes = box.querySelectorAll("[data-note]");
    if (!notes.length) return;
    var position = parseInt(box.dataset.position || "0", 10);
    var current = Math.min(position + 1, notes.length);
    back = Math.max(0, Math.min(back, current - 1));
    notes.forEach(function (note) {
      note.hidden = parseInt(note.dataset.note, 10) !== current - back;
    });
    box.dataset.back = String(back);
  }

  function nextStep() {
    var box = guide();
    if (!box) return;
    if (back > 0) { back -= 1; showNotes(); return; }
    if (!box.dataset.nextUrl || box.dataset.busy === "true") return;
    box.dataset.busy = "true";
    fetch(box.dataset.nextUrl, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken(), "HX-Request": "true" },
      credentials: "same-origin"
    }).then(function (response) {
      if (!response.ok) {
        return response.text().then(function (html) {
          // A refusal says why on its error page (a lab viewed read-only, say): show it, not nothing.
          var page = new DOMParser().parseFromString(html, "text/html");
          var why = page.querySelector(".error-page p, [data-guide-error]");
          refused("The next step was refused (HTTP " + response.status + ")"
                  + (why ? ": " + why.textContent.trim() : "."));
        });
      }
    }).catch(function () {
      refused("The next step did not reach the server.");
    }).finally(function () {
      if (window.labLive) window.labLive.pollNow();
    });
  }

  function refused(message) {
    var box = guide();
    if (box) box.dataset.busy = "false";  // nothing runs: the key may be pressed again
    var notices = document.getElementById("notices");
    if (!notices) return;
    var notice = document.createElement("p");
    notice.className = "notice bad";
    notice.setAttribute("role", "alert");
    notice.textContent = "✕ " + message;
    notices.replaceChildren(notice);
  }

  function toggleSql() {
    var sql = document.getElementById("present-sql");
    if (sql) sql.hidden = !sql.hidden;
  }

  document.addEventListener("DOMContentLoaded", function () {
    showNotes();
    document.body.addEventListener("htmx:afterSwap", function (event) {
      var target = event.detail.target;  // none in a pushed panel's swap (the SSE extension)
      if (target && target.classList.contains("present-guide-slot")) showNotes();
    });
    document.addEventListener("keydown", function (event) {
      if (event.altKey || event.ctrlKey || event.metaKey) return;
      if (event.target.matches && event.target.matches("input, select, textarea")) return;
      var key = event.key;
      if (key === "ArrowRight" || key === "PageDown" || key === " " || key === "n" || key === "N") {
        event.preventDefault();
        nextStep();
      } else if (key === "ArrowLeft" || key === "PageUp" || key === "b" || key === "B") {
        event.preventDefault();
        back += 1;
        showNotes();
      } else if (key === "s" || key === "S") {
        event.preventDefault();
        toggleSql();
      }
    });
  });
})();
