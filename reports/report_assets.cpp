#include "reports/report_assets.h"

namespace fsdpsim::reports {

// Palette: Tableau-10-like hues, one per stream; memory categories reuse the hue of the stream that
// moves them where there is one (unsharded params ~ all-gather orange, grads ~ reduce-scatter green).
const char* report_css() {
  return R"CSS(
:root{--bg:#f7f8fa;--fg:#1d2330;--muted:#5b6475;--card:#ffffff;--line:#d9dde5;--grid:#e8ebf0;--accent:#2f6fd6;
--good:#1f8a4c;--warn:#b7791f;--bad:#c53030;--code:#f0f2f6;
--c-fwd:#4c78a8;--c-bwd:#2f5d8a;--c-rec:#8fbfe8;--c-opt:#9d755d;--c-cmp:#5b8fc4;
--c-ag:#f58518;--c-rs:#54a24b;--c-ar:#b279a2;--c-copy:#eeca3b;--c-h2d:#9d755d;--c-cpu:#8c8c8c;--c-oth:#bab0ac;--c-exp:#e45756;
--m-sp:#4c78a8;--m-sg:#72b7b2;--m-os:#b279a2;--m-up:#f58518;--m-ug:#54a24b;--m-cb:#eeca3b;--m-act:#e45756;--m-log:#ff9da6;--m-slack:#bab0ac;--m-ctx:#79706e;--m-oth:#d6d6d6;}
@media (prefers-color-scheme: dark){:root{--bg:#12151b;--fg:#e4e7ee;--muted:#9aa3b5;--card:#1b2029;--line:#333a47;--grid:#262c37;--accent:#7aa7ff;
--good:#48c78e;--warn:#f0b429;--bad:#ff6b6b;--code:#232936;--c-bwd:#6d9bd1;--c-fwd:#4c78a8;--c-rec:#a7d0f5;}}
*{box-sizing:border-box}
html{background:var(--bg);color:var(--fg)}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px}
header.top{border-bottom:1px solid var(--line);padding-bottom:10px;margin-bottom:16px}
header.top h1{font-size:22px;margin:0 0 4px}
.sub{color:var(--muted)}
h2{font-size:18px;margin:0 0 10px}
h3{font-size:15px;margin:14px 0 6px}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:16px 18px;margin:0 0 16px;break-inside:avoid}
.card-rec{border-left:5px solid var(--good)}
.card-none{border-left:5px solid var(--bad)}
.plan-label{font:600 15px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;border:1px solid var(--line);color:var(--muted);margin-left:6px}
.metrics{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px;margin:12px 0}
.metric{border:1px solid var(--line);border-radius:6px;padding:8px 10px}
.metric .v{font-size:20px;font-weight:650}
.metric .k{color:var(--muted);font-size:12px}
.metric .d{color:var(--muted);font-size:12px}
.ok{color:var(--good)}.warn{color:var(--warn)}.bad{color:var(--bad)}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:5px 7px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
td.n,th.n{text-align:right;white-space:nowrap}
table.kv{width:auto;min-width:50%}
table.kv th{color:var(--muted);font-weight:500;white-space:nowrap}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:16px}
table.sortable th{cursor:pointer;user-select:none;white-space:nowrap}
table.sortable th[aria-sort=ascending]::after{content:" \25B2"}
table.sortable th[aria-sort=descending]::after{content:" \25BC"}
tr.rec td{background:color-mix(in srgb,var(--good) 12%,transparent)}
tr.nofit td{color:var(--muted)}
.scroll{overflow-x:auto}
#candidate-table .plan-label{display:inline-block;max-width:240px;font-size:12px;font-weight:500}
#candidate-table{font-size:13px}
pre{background:var(--code);border-radius:6px;padding:10px 12px;overflow-x:auto;font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;margin:6px 0}
.export{margin-bottom:10px}
.export summary{display:flex;align-items:center;gap:10px;flex-wrap:wrap}
.export summary h3{margin:6px 0;display:inline}
.export summary::before{content:"\25B8";color:var(--muted)}
.export[open] summary::before{content:"\25BE"}
.export summary{list-style:none}
.export summary::-webkit-details-marker{display:none}
td.long{color:var(--muted);font-size:12.5px}
button.copy{font:inherit;font-size:12px;padding:3px 10px;border-radius:5px;border:1px solid var(--line);background:var(--card);color:var(--fg);cursor:pointer}
button.copy:hover{border-color:var(--accent)}
.unsupported{color:var(--warn);font-size:13px}
svg.chart{max-width:100%;height:auto;display:block;font:11px system-ui,sans-serif}
svg .gridline{stroke:var(--grid);stroke-width:1}
svg .axis{stroke:var(--muted);stroke-width:1}
svg .tick{fill:var(--muted)}
svg .axis-label{fill:var(--muted);font-size:12px}
svg .axis-label-y{writing-mode:vertical-rl;transform-box:fill-box;transform-origin:center;transform:rotate(180deg)}
svg .capacity-line{stroke:var(--bad);stroke-width:1.5;stroke-dasharray:6 3}
svg .margin-line{stroke:var(--warn);stroke-width:1;stroke-dasharray:3 3}
svg .cap-label{fill:var(--bad);font-size:11px}
svg .pareto-line{fill:none;stroke:var(--accent);stroke-width:1.5;opacity:.7}
svg .pt{stroke:var(--card);stroke-width:1}
svg .pt.fit{fill:var(--good)}
svg .pt.tight{fill:var(--warn)}
svg .pt.nofit{fill:var(--bad);opacity:.55}
svg .pt.pareto{stroke:var(--accent);stroke-width:1.6}
svg .rec-ring{fill:none;stroke:var(--fg);stroke-width:2}
svg .rec-label{fill:var(--fg);font-size:12px;font-weight:600}
svg .bar-track{fill:var(--grid)}
svg .lane{fill:var(--grid);opacity:.5}
svg .lane-label{fill:var(--fg);font-size:12px}
svg .series{fill:none;stroke-width:1.8}
svg .series.allocated{stroke:var(--accent)}
svg .series.reserved{stroke:var(--warn);stroke-dasharray:5 2}
svg .peak-marker{fill:var(--accent)}
svg .peak-label{fill:var(--fg);font-size:11px}
svg .span{stroke:var(--card);stroke-width:.6}
svg .span.merged{opacity:.75}
.trk-compute{fill:var(--c-cmp);background:var(--c-cmp)}
.trk-compute.k-forward{fill:var(--c-fwd);background:var(--c-fwd)}
.trk-compute.k-backward{fill:var(--c-bwd);background:var(--c-bwd)}
.trk-compute.k-recompute{fill:var(--c-rec);background:var(--c-rec)}
.trk-compute.k-optimizer{fill:var(--c-opt);background:var(--c-opt)}
.trk-all_gather{fill:var(--c-ag);background:var(--c-ag)}
.trk-reduce_scatter{fill:var(--c-rs);background:var(--c-rs)}
.trk-all_reduce{fill:var(--c-ar);background:var(--c-ar)}
.trk-copy_in,.trk-copy_out{fill:var(--c-copy);background:var(--c-copy)}
.trk-h2d,.trk-d2h{fill:var(--c-h2d);background:var(--c-h2d)}
.trk-optimizer{fill:var(--c-opt);background:var(--c-opt)}
.trk-cpu{fill:var(--c-cpu);background:var(--c-cpu)}
.trk-other{fill:var(--c-oth);background:var(--c-oth)}
.exposed{fill:var(--c-exp);background:var(--c-exp)}
.cat-sharded_params{fill:var(--m-sp);background:var(--m-sp)}
.cat-sharded_grads{fill:var(--m-sg);background:var(--m-sg)}
.cat-optimizer_state{fill:var(--m-os);background:var(--m-os)}
.cat-unsharded_params{fill:var(--m-up);background:var(--m-up)}
.cat-unsharded_grads{fill:var(--m-ug);background:var(--m-ug)}
.cat-comm_buffers{fill:var(--m-cb);background:var(--m-cb)}
.cat-activations{fill:var(--m-act);background:var(--m-act)}
.cat-logits{fill:var(--m-log);background:var(--m-log)}
.cat-allocator_slack{fill:var(--m-slack);background:var(--m-slack)}
.cat-cuda_context{fill:var(--m-ctx);background:var(--m-ctx)}
.cat-other{fill:var(--m-oth);background:var(--m-oth)}
ul.legend{list-style:none;padding:0;margin:8px 0 0;display:flex;flex-wrap:wrap;gap:6px 18px;font-size:12.5px;color:var(--muted)}
ul.legend li{display:flex;align-items:center;gap:6px}
ul.legend-table li{min-width:300px}
.lg-name{min-width:130px;color:var(--fg)}.lg-val{min-width:80px;text-align:right}.lg-pct{min-width:110px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px}
.sw-dot{border-radius:50%}.sw-dot.fit{background:var(--good)}.sw-dot.tight{background:var(--warn)}.sw-dot.nofit{background:var(--bad)}
.sw-dot.pareto{background:transparent;border:2.5px solid var(--accent)}
.sw-ring{border-radius:50%;border:2px solid var(--fg)}
.sw-line{height:0;border-top:2px dashed var(--bad);border-radius:0}
.note{color:var(--muted);font-size:12.5px}
details summary{cursor:pointer;color:var(--muted)}
footer{color:var(--muted);font-size:12px;margin-top:10px}
footer dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px}
footer dt{font-weight:600}footer dd{margin:0;word-break:break-all}
@media print{html,body{background:#fff;color:#000}section{border-color:#bbb;break-inside:avoid}
button.copy{display:none}main{max-width:none;padding:0}.scroll{overflow:visible}pre{white-space:pre-wrap}}
)CSS";
}

const char* report_head_script() {
  return R"JS(
window.__fsdpsimErrors=0;
function __fsdpsimNote(msg){window.__fsdpsimErrors++;var b=document.body;if(b){b.setAttribute('data-errors',String(window.__fsdpsimErrors));b.setAttribute('data-last-error',String(msg).slice(0,300));}}
window.addEventListener('error',function(e){__fsdpsimNote(e&&e.message?e.message:'failed to load '+(e&&e.target&&(e.target.src||e.target.href)||'a resource'));},true);
window.addEventListener('unhandledrejection',function(e){__fsdpsimNote('unhandled rejection: '+(e&&e.reason));});
(function(){var ce=console.error;console.error=function(){__fsdpsimNote(Array.prototype.join.call(arguments,' '));return ce.apply(console,arguments);};})();
)JS";
}

const char* report_body_script() {
  return R"JS(
(function(){
  function sortBy(t,col,th){
    var dir=th.getAttribute('aria-sort')==='ascending'?'descending':'ascending';
    Array.prototype.forEach.call(t.tHead.rows[0].cells,function(h){h.removeAttribute('aria-sort');});
    th.setAttribute('aria-sort',dir);
    var body=t.tBodies[0],rows=Array.prototype.slice.call(body.rows),num=th.getAttribute('data-type')==='num';
    rows.sort(function(a,b){
      var x=a.cells[col].getAttribute('data-v'),y=b.cells[col].getAttribute('data-v');
      var c=num?(parseFloat(x)-parseFloat(y)):(x<y?-1:(x>y?1:0));
      if(c===0)c=parseInt(a.getAttribute('data-index'),10)-parseInt(b.getAttribute('data-index'),10);
      return dir==='ascending'?c:-c;});
    rows.forEach(function(r){body.appendChild(r);});
  }
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),function(t){
    Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,col){
      th.tabIndex=0;
      th.addEventListener('click',function(){sortBy(t,col,th);});
      th.addEventListener('keydown',function(e){if(e.key==='Enter'||e.key===' '){e.preventDefault();sortBy(t,col,th);}});
    });
  });
  function selectText(el){var r=document.createRange();r.selectNodeContents(el);var s=window.getSelection();s.removeAllRanges();s.addRange(r);
    try{return document.execCommand('copy');}catch(e){return false;}}
  Array.prototype.forEach.call(document.querySelectorAll('button.copy'),function(b){
    b.addEventListener('click',function(){
      var el=document.getElementById(b.getAttribute('data-target'));if(!el)return;
      var done=function(ok){b.textContent=ok?'Copied':'Selected: press Ctrl+C';setTimeout(function(){b.textContent='Copy';},1800);};
      if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(el.textContent).then(function(){done(true);},function(){done(selectText(el));});}
      else{done(selectText(el));}
    });
  });
  // Printing shows the folded parts (exports, long lists) too.
  window.addEventListener('beforeprint',function(){Array.prototype.forEach.call(document.querySelectorAll('details'),function(d){d.open=true;});});
  document.body.setAttribute('data-errors',String(window.__fsdpsimErrors||0));
  document.body.setAttribute('data-ready','1');
})();
)JS";
}

}  // namespace fsdpsim::reports
