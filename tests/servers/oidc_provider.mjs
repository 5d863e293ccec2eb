// A real OAuth 2.1 / OpenID authorization server for the gateway's authorization tests:
// `oidc-provider` (OpenID Certified, from tests/npm), configured by the test.
//
// Usage: node tests/servers/oidc_provider.mjs CONFIG.json
//
// CONFIG.json:
//   port       0 binds an ephemeral port; a restart passes the port it had, so the issuer
//              (http://127.0.0.1:<port>) stays the same while the signing key changes
//   keys       the private signing JWKs (RSA, each with a kid); the first one signs. Absent:
//              a new RSA key made at each start (for trying it by hand)
//   clients    [{client_id, client_secret}]: client_credentials clients (client_secret_basic)
//   resources  {"<resource indicator>": {scope: "a b", format: "jwt" | "opaque", ttl: seconds}}
//              the resource servers (RFC 8707) tokens can be bound to; any other indicator
//              is refused with invalid_target
//
// Prints `READY <port>` on stdout once it accepts connections; SIGTERM stops it.

import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

// tests/npm holds the package (`make npm-deps`); ES modules do not search NODE_PATH.
import Provider, { errors } from '../npm/node_modules/oidc-provider/lib/index.js';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const resources = config.resources ?? {};

function generatedKeys() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return [{ ...privateKey.export({ format: 'jwk' }), kid: 'generated', alg: 'RS256', use: 'sig' }];
}

function resourceServer(indicator) {
  const entry = resources[indicator];
  if (entry === undefined) {
    throw new errors.InvalidTarget();
  }
  const info = {
    scope: entry.scope ?? '',
    audience: indicator,
    accessTokenTTL: entry.ttl ?? 300,
  };
  if ((entry.format ?? 'jwt') === 'jwt') {
    info.accessTokenFormat = 'jwt';
    info.jwt = { sign: { alg: 'RS256' } };
  } else {
    info.accessTokenFormat = 'opaque';
  }
  return info;
}

const server = createServer();
server.listen(config.port ?? 0, '127.0.0.1', () => {
  const { port } = server.address();
  const provider = new Provider(`http://127.0.0.1:${port}`, {
    jwks: { keys: config.keys ?? generatedKeys() },
    clients: (config.clients ?? []).map((client) => ({
      client_id: client.client_id,
      client_secret: client.client_secret,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_basic',
    })),
    features: {
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      devInteractions: { enabled: false },
      resourceIndicators: {
        enabled: true,
        // No resource parameter: no resource server, so an opaque token with no audience.
        defaultResource: () => undefined,
        getResourceServerInfo: (_ctx, indicator) => resourceServer(indicator),
        useGrantedResource: () => true,
      },
    },
    // Each resource server's ttl (its accessTokenTTL), stated so the server does not warn.
    ttl: { ClientCredentials: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? 300 },
    // Fixed secrets: this server lives for one test module on loopback, and nothing it
    // issues outlives it.
    cookies: { keys: ['oidc-provider-test-cookie-key'] },
  });
  server.on('request', provider.callback());
  process.stdout.write(`READY ${port}\n`);
});

process.on('SIGTERM', () => {
  server.close();
  server.closeAllConnections();
  process.exit(0);
});
