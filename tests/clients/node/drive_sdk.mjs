// The MCP TypeScript SDK's client (@modelcontextprotocol/sdk, pinned in package.json) against `keel serve`: list
// the tools, make the plan's calls. The SDK validates every structured result against the tool's outputSchema
// (Ajv) and fails the call when one does not match, so a passing run is also that check. Plan on stdin, one JSON
// document on stdout (tests/support/agent_clients.py).
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(readFileSync(0, "utf8"));
const sdkVersion = JSON.parse(readFileSync(new URL("node_modules/@modelcontextprotocol/sdk/package.json",
  import.meta.url), "utf8")).version;

const transport = plan.transport === "stdio"
  ? new StdioClientTransport({ command: plan.command, args: plan.args, cwd: plan.cwd, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(plan.url),
      { requestInit: { headers: { Authorization: `Bearer ${plan.token}` } } });

const client = new Client({ name: "keel-test-typescript", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const answers = [];
for (const call of plan.calls) {
  const result = await client.callTool({ name: call.tool, arguments: call.arguments });
  const text = (result.content ?? []).map((c) => c.text ?? "").join("");
  if (result.isError) {
    answers.push({ ok: false, error: text });
  } else {
    if (JSON.stringify(JSON.parse(text)) !== JSON.stringify(result.structuredContent)) {
      throw new Error(`${call.tool}: text and structuredContent differ`);
    }
    answers.push({ ok: true, value: result.structuredContent });
  }
}
await client.close();
process.stdout.write(JSON.stringify({ client: `@modelcontextprotocol/sdk ${sdkVersion}`, tools, answers }) + "\n");
