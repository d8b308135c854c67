/// The console's one stylesheet and its little script, served from `/console/assets/` (nothing is fetched from elsewhere).
enum ConsoleAssets {
    static let stylesheet = """
    :root { --ink: #1b1f24; --muted: #4d5562; --line: #d0d5dc; --accent: #0b57d0; --bad: #b3261e; --good: #146c2e; --paper: #fff; --soft: #f4f6f8; }
    * { box-sizing: border-box; }
    body { margin: 0; font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink); background: var(--soft); }
    a { color: var(--accent); }
    a:focus-visible, button:focus-visible, input:focus-visible, select:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
    .skip { position: absolute; left: -999px; top: 0; background: var(--paper); padding: .5rem 1rem; }
    .skip:focus { left: 0; z-index: 10; }
    header { background: var(--ink); color: #fff; padding: .5rem 1rem; display: flex; flex-wrap: wrap; gap: .5rem 1.5rem; align-items: center; }
    header .brand { font-weight: 700; margin-right: auto; }
    header nav ul { list-style: none; margin: 0; padding: 0; display: flex; flex-wrap: wrap; gap: .25rem 1rem; }
    header a { color: #fff; }
    header a[aria-current="page"] { font-weight: 700; text-decoration-thickness: 3px; }
    header form { margin: 0; }
    header button { background: transparent; color: #fff; border: 1px solid #fff; }
    main { max-width: 72rem; margin: 0 auto; padding: 1rem; }
    h1 { font-size: 1.6rem; margin: .5rem 0 1rem; }
    h2 { font-size: 1.2rem; margin: 1.5rem 0 .5rem; }
    section, .card { background: var(--paper); border: 1px solid var(--line); border-radius: 6px; padding: 1rem; margin-bottom: 1rem; }
    .cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(14rem, 1fr)); gap: 1rem; }
    .figure { font-size: 1.5rem; font-weight: 700; }
    .muted, .empty { color: var(--muted); }
    .table { overflow-x: auto; }
    table { border-collapse: collapse; width: 100%; background: var(--paper); }
    caption { text-align: left; font-weight: 600; padding: .25rem 0; }
    th, td { border-bottom: 1px solid var(--line); padding: .35rem .5rem; text-align: left; vertical-align: top; word-break: break-word; }
    form { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: flex-end; margin: .5rem 0; }
    .field { display: flex; flex-direction: column; min-width: 10rem; }
    label { font-size: .9rem; color: var(--muted); }
    input, select, button { font: inherit; padding: .4rem .6rem; border: 1px solid var(--muted); border-radius: 4px; background: var(--paper); color: var(--ink); }
    button { background: var(--accent); color: #fff; border-color: var(--accent); cursor: pointer; }
    button.danger { background: var(--bad); border-color: var(--bad); }
    .notice { padding: .5rem 1rem; border-radius: 4px; margin-bottom: 1rem; border: 1px solid var(--good); background: #e7f4ea; }
    .error { padding: .5rem 1rem; border-radius: 4px; margin-bottom: 1rem; border: 1px solid var(--bad); background: #fbeaea; }
    .chart { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 1fr); gap: 1rem; align-items: start; }
    .chart figure { margin: 0; }
    .chart figure > svg { width: 100%; height: auto; background: var(--paper); }
    svg.swatch { width: 12px; height: 12px; vertical-align: middle; }
    .login { max-width: 24rem; margin: 3rem auto; }
    .login form { flex-direction: column; align-items: stretch; }
    @media (max-width: 40rem) { .chart { grid-template-columns: 1fr; } header { flex-direction: column; align-items: flex-start; } }
    """

    /// Confirmation for destructive forms (the form also requires its confirmation box, so it works without script).
    static let script = """
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var message = form.getAttribute("data-confirm");
      if (message && !window.confirm(message)) { event.preventDefault(); }
    });
    """
}
