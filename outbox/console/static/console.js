// Partial refresh: every few seconds each [data-region] of the page is replaced by the same
// region of a fresh copy of the page. The page itself never reloads, so what a person types in
// a form (always outside the regions) stays as it is. A region holding the focus is skipped.
(function () {
  "use strict";
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  document.addEventListener("submit", function (event) {
    var message = event.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) { event.preventDefault(); }
  });
  if (!seconds || !document.querySelector("[data-region]")) { return; }
  var busy = false;
  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Console-Refresh": "1" } })
      .then(function (response) {
        if (!response.ok) { throw new Error(response.status + " " + response.statusText); }
        return response.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-region]").forEach(function (region) {
          var next = fresh.querySelector('[data-region="' + region.getAttribute("data-region") + '"]');
          if (next && !region.contains(document.activeElement)) { region.innerHTML = next.innerHTML; }
        });
        var stamp = document.getElementById("refreshed");
        if (stamp) { stamp.textContent = "updated " + new Date().toLocaleTimeString(); }
      })
      .catch(function (error) {
        var stamp = document.getElementById("refreshed");
        if (stamp) { stamp.textContent = "could not refresh (" + error.message + "): showing older data"; }
      })
      .finally(function () { busy = false; });
  }
  window.setInterval(refresh, seconds * 1000);
})();
