// nerve's chat templates in transformers.js's Jinja engine (@huggingface/jinja): every case
// scripts/chat_template_check.py dumped (the template's Jinja text, its variables and the prompt
// `nerve serve` gave for them) is rendered again here and must give the same text.
// usage: node chat_templates.mjs NODE_MODULES DUMP.json
import { createRequire } from "module";
import { readFileSync } from "fs";

const [modules, dumpPath] = process.argv.slice(2);
const require = createRequire(modules + "/");
const { Template } = require("@huggingface/jinja");
const cases = JSON.parse(readFileSync(dumpPath, "utf8"));
const same = {}, total = {};
let failed = 0;
for (const c of cases) {
  total[c.template] = (total[c.template] || 0) + 1;
  let text;
  try {
    text = new Template(c.jinja).render(c.variables);
  } catch (e) {
    text = `(error: ${e.message})`;
  }
  if (text === c.prompt) same[c.template] = (same[c.template] || 0) + 1;
  else {
    failed++;
    console.log(`${c.template} case ${c.case}:\n  jinja: ${JSON.stringify(text)}\n  nerve: ${JSON.stringify(c.prompt)}`);
  }
}
for (const t of Object.keys(total))
  console.log(`chat_templates.mjs: ${t}: ${same[t] || 0}/${total[t]} conversations rendered alike by @huggingface/jinja`);
process.exit(failed ? 1 : 0);
