// examples/dashboard/test/check.js -- opens the dashboard in headless Chromium (Debian's
// /usr/bin/chromium, driven by playwright-core), waits until the page has drawn the site's
// rollups, saves a screenshot and prints what the page shows as JSON on stdout:
//   {rows: [{block, variant, impressions, clicks, ctr, uniques}], blocks, charts, lines, status}
// Used by spec/dashboard_spec.lua:  node check.js URL SCREENSHOT.png
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

async function main() {
  const [url, shot] = process.argv.slice(2);
  if (!url || !shot) throw new Error("usage: node check.js URL SCREENSHOT.png");
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "esx-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 900 },
  });
  try {
    const page = context.pages()[0] || (await context.newPage());
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    // nothing but loopback may be fetched
    await page.route("**/*", (route) => {
      const host = new URL(route.request().url()).hostname;
      return host === "127.0.0.1" || host === "localhost" ? route.continue() : route.abort();
    });
    await page.goto(url, { waitUntil: "load", timeout: 15000 });
    await page.waitForSelector("body[data-ready='1'] #totals tbody tr", { timeout: 15000 });
    const shown = await page.evaluate(() => ({
      rows: [...document.querySelectorAll("#totals tbody tr")].map((tr) => {
        const cell = (k) => tr.querySelector(`[data-k='${k}']`).textContent;
        return { block: tr.dataset.block, variant: tr.dataset.variant,
                 impressions: Number(cell("impressions")), clicks: Number(cell("clicks")),
                 ctr: cell("ctr"), uniques: Number(cell("uniques")) };
      }),
      blocks: document.querySelectorAll("#charts .block").length,
      charts: document.querySelectorAll("#charts svg").length,
      lines: document.querySelectorAll("#charts svg path.line").length,
      status: document.querySelector("#status").textContent,
      site: document.querySelector("#site").value,
    }));
    shown.errors = errors;
    await page.screenshot({ path: shot, fullPage: true });
    process.stdout.write(JSON.stringify(shown) + "\n");
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((e) => { console.error("check.js:", e && e.stack || e); process.exit(1); });
