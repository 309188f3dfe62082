// The results page's only script: a cell's details on a click, and the three filters. No framework, nothing fetched.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("cells").textContent);
  var dialog = document.getElementById("detail");
  var title = document.getElementById("detail-title");
  var list = document.getElementById("detail-list");

  function show(id) {
    // a cell: [title, its own lines, its run's index]; a line: [label, text], each an index into data.strings
    var cell = data.cells[id];
    if (!cell) { return; }
    var text = data.strings;
    title.textContent = text[cell[0]];
    list.replaceChildren();
    cell[1].concat(data.runs[cell[2]]).forEach(function (pair) {
      var dt = document.createElement("dt");
      var dd = document.createElement("dd");
      dt.textContent = text[pair[0]];
      if (text[pair[0]] === "reproduce") {
        var code = document.createElement("code");
        code.textContent = text[pair[1]];
        dd.append(code);
      } else {
        dd.textContent = text[pair[1]];
      }
      list.append(dt, dd);
    });
    dialog.showModal();
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-cell]");
    if (button) { show(button.dataset.cell); }
  });

  var engine = document.getElementById("filter-engine");
  var model = document.getElementById("filter-model");
  var verdict = document.getElementById("filter-verdict");
  var count = document.getElementById("filter-count");

  function apply() {
    var shown = 0;
    document.querySelectorAll("section.matrix").forEach(function (section) {
      section.hidden = model.value !== "" && section.dataset.model !== model.value;
      section.querySelectorAll("tbody tr").forEach(function (row) {
        var hide = (engine.value !== "" && row.dataset.engine !== engine.value) ||
          (verdict.value !== "" && row.dataset.verdicts.split("|").indexOf(verdict.value) < 0);
        row.hidden = hide;
        if (!hide && !section.hidden) { shown += 1; }
      });
    });
    document.querySelectorAll("table.lines tbody tr").forEach(function (row) {
      row.hidden = engine.value !== "" && row.dataset.engine !== engine.value;
    });
    count.textContent = shown + " rows shown";
  }

  [engine, model, verdict].forEach(function (select) { select.addEventListener("change", apply); });
  document.getElementById("filter-form").addEventListener("reset", function () { setTimeout(apply, 0); });
  apply();
}());
