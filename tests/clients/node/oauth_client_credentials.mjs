// An MCP client of the TypeScript SDK that signs in with the client-credentials grant (ClientCredentialsProvider),
// driven by tests/test_oauth_keycloak.py as a subprocess: it connects to Keel, makes the calls it is given and prints
// one JSON object on stdout saying how each went and which scopes it asked the authorization server for.
//
// Usage: KEEL_CLIENT_SECRET=... node oauth_client_credentials.mjs SERVER_URL ISSUER CLIENT_ID CALLS_JSON [SCOPE]
//   CALLS_JSON: [{"tool": "context", "arguments": {...}}, ...]
//   SCOPE: the provider's `scope` option. The SDK (1.32) asks for that scope, or for none, in every client-credentials
//   token request: not for the scope of a 401's or 403's challenge, which only its authorization-code flow uses.
// The secret comes from the environment, not the command line (which other users of the machine can read).
// Output: {"connected": true, "tools": [names], "calls": [{"tool", "ok", "result" | "error" | "thrown"}],
//          "token_requests": [{"grant_type", "scope"}]}; exit 0 once connected, 1 when connecting failed.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ClientCredentialsProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';

const [serverUrl, issuer, clientId, callsJson, scope] = process.argv.slice(2);
const clientSecret = process.env.KEEL_CLIENT_SECRET;
if (!serverUrl || !issuer || !clientId || !callsJson || !clientSecret) {
    console.error('usage: KEEL_CLIENT_SECRET=... node oauth_client_credentials.mjs SERVER_URL ISSUER CLIENT_ID CALLS_JSON [SCOPE]');
    process.exit(2);
}
const calls = JSON.parse(callsJson);
const tokenRequests = [];

// Every request the transport and its auth flow make goes through here: the token requests are recorded (grant and
// scope only: never the client's credentials).
async function recordingFetch(url, init) {
    const body = init?.body;
    if (body instanceof URLSearchParams && body.get('grant_type')) {
        tokenRequests.push({ grant_type: body.get('grant_type'), scope: body.get('scope') });
    }
    return fetch(url, init);
}

const provider = new ClientCredentialsProvider({ clientId, clientSecret, expectedIssuer: issuer, scope: scope || undefined });
const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider, fetch: recordingFetch });
const client = new Client({ name: 'keel-oauth-client-credentials', version: '1.0.0' }, { capabilities: {} });
const out = { connected: false, tools: [], calls: [], token_requests: tokenRequests };

try {
    await client.connect(transport);
    out.connected = true;
    out.tools = (await client.listTools()).tools.map(t => t.name);
    for (const call of calls) {
        try {
            const result = await client.callTool({ name: call.tool, arguments: call.arguments ?? {} });
            if (result.isError) {
                out.calls.push({ tool: call.tool, ok: false, error: result.content?.[0]?.text ?? '' });
            } else {
                out.calls.push({ tool: call.tool, ok: true, result: result.structuredContent ?? null });
            }
        } catch (err) {
            out.calls.push({ tool: call.tool, ok: false, thrown: String(err?.message ?? err) });
        }
    }
} catch (err) {
    out.error = String(err?.message ?? err);
} finally {
    await transport.close().catch(() => {});
}
console.log(JSON.stringify(out));
process.exit(out.connected ? 0 : 1);
