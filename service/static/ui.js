// shardwise pages: filter a table as you type, copy a snippet, confirm a delete. No framework; htmx does the rest.
(function () {
  "use strict";

  function filterRows(input) {
    var body = document.querySelector(input.dataset.filter);
    if (!body) return;
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0, rows = body.rows;
    for (var i = 0; i < rows.length; i++) {
      var text = rows[i].textContent.toLowerCase();
      var match = words.every(function (w) { return text.indexOf(w) !== -1; });
      rows[i].hidden = !match;
      if (match) shown++;
    }
    var count = input.dataset.count && document.querySelector(input.dataset.count);
    if (count) count.textContent = words.length ? shown + " of " + rows.length + " shown" : "";
  }

  document.addEventListener("input", function (e) {
    var t = e.target;
    if (t instanceof HTMLInputElement && t.dataset.filter) filterRows(t);
  });

  // a form that changes something asks first (data-confirm holds the question)
  document.addEventListener("submit", function (e) {
    var f = e.target;
    if (f instanceof HTMLFormElement && f.dataset.confirm && !window.confirm(f.dataset.confirm)) e.preventDefault();
  });

  document.addEventListener("click", function (e) {
    var t = e.target;
    if (!(t instanceof HTMLElement) || !t.dataset.copy) return;
    var source = document.querySelector(t.dataset.copy);
    if (!source) return;
    var done = function () { t.textContent = "copied"; setTimeout(function () { t.textContent = "copy"; }, 1500); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(source.textContent).then(done);
    } else {
      var range = document.createRange();
      range.selectNodeContents(source);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      if (document.execCommand("copy")) done();
    }
  });
})();
