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
//   code_clients
//              [{client_id, client_secret?, redirect_uris?, token_endpoint_auth_method?}]:
//              authorization-code clients, `application_type: native`, PKCE (S256) required.
//              Without client_secret a public client (`none`), with one client_secret_basic
//              unless token_endpoint_auth_method says otherwise. redirect_uris default to
//              ["http://127.0.0.1/callback"]: for a native client oidc-provider ignores the port
//              of an http loopback redirect URI (RFC 8252 7.3), so any ephemeral port matches.
//   registration
//              true: dynamic client registration (RFC 7591) at /reg, open (no initial token)
//   refresh_tokens
//              "offline_access" (the default, oidc-provider's own rule: only when the grant has
//              offline_access, which it keeps only for a request with prompt=consent) or
//              "always": every authorization-code grant of a client allowed the refresh_token
//              grant gets one (as an MCP client expects, asking only for the resource's scope)
//   refresh_ttl
//              a refresh token's lifetime in seconds (default 86400)
//   login      true: oidc-provider's devInteractions, its own login page (any login, any
//              password) and consent page, which tests/servers/browser_login.mjs drives
//   resources  {"<resource indicator>": {scope: "a b", format: "jwt" | "opaque", ttl: seconds}}
//              the resource servers (RFC 8707) tokens can be bound to; any other indicator
//              is refused with invalid_target
//
// Every authorization response carries `iss` (RFC 9207): oidc-provider 9 always adds it (the
// discovery document says authorization_response_iss_parameter_supported) and knows no
// `features.issAuthResp` any more (an unknown feature is a TypeError at start).
//
// Prints `READY <port>` on stdout once it accepts connections; SIGTERM stops it. Then one line
// per event a test counts, `EVENT <name> <JSON>`: `registration` (the registered client's
// metadata), `authorization` (a successful authorization response: client_id, code) and
// `grant` (a token endpoint success: grant_type, client_id).

import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

// tests/npm holds the package (`make npm-deps`); ES modules do not search NODE_PATH.
import Provider, { errors } from '../npm/node_modules/oidc-provider/lib/index.js';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const resources = config.resources ?? {};
const refreshTokens = config.refresh_tokens ?? 'offline_access';
if (!['offline_access', 'always'].includes(refreshTokens)) {
  throw new TypeError(`refresh_tokens: ${refreshTokens}`);
}

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

function credentialsClient(client) {
  return {
    client_id: client.client_id,
    client_secret: client.client_secret,
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'client_secret_basic',
  };
}

function codeClient(client) {
  const confidential = client.client_secret !== undefined;
  return {
    client_id: client.client_id,
    ...(confidential ? { client_secret: client.client_secret } : {}),
    application_type: 'native',
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    redirect_uris: client.redirect_uris ?? ['http://127.0.0.1/callback'],
    token_endpoint_auth_method:
      client.token_endpoint_auth_method ?? (confidential ? 'client_secret_basic' : 'none'),
  };
}

// The default mode passes no function at all: oidc-provider tells its own default apart by
// identity, and any other function changes what it announces (grant_types_supported).
const issueRefreshToken = refreshTokens === 'always'
  ? { issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token') }
  : {};

const server = createServer();
server.listen(config.port ?? 0, '127.0.0.1', () => {
  const { port } = server.address();
  const provider = new Provider(`http://127.0.0.1:${port}`, {
    jwks: { keys: config.keys ?? generatedKeys() },
    clients: [
      ...(config.clients ?? []).map(credentialsClient),
      ...(config.code_clients ?? []).map(codeClient),
    ],
    ...issueRefreshToken,
    // OAuth 2.1: PKCE for every authorization-code client, confidential ones too (oidc-provider
    // requires it of public clients only), so a client that leaves it out fails here.
    pkce: { required: () => true },
    features: {
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      devInteractions: { enabled: config.login === true },
      registration: { enabled: config.registration === true },
      resourceIndicators: {
        enabled: true,
        // No resource parameter: no resource server, so an opaque token with no audience.
        defaultResource: () => undefined,
        getResourceServerInfo: (_ctx, indicator) => resourceServer(indicator),
        useGrantedResource: () => true,
      },
    },
    // Every lifetime stated, so the server does not warn; an access token lives as long as its
    // resource server says (its accessTokenTTL), a refresh token as long as the test says.
    ttl: {
      ClientCredentials: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? 300,
      AccessToken: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? 300,
      AuthorizationCode: 60,
      RefreshToken: config.refresh_ttl ?? 86400,
      Grant: 86400,
      Interaction: 600,
      Session: 86400,
      IdToken: 300,
    },
    // Fixed secrets: this server lives for one test module on loopback, and nothing it
    // issues outlives it.
    cookies: { keys: ['oidc-provider-test-cookie-key'] },
  });
  const event = (name, fields) => process.stdout.write(`EVENT ${name} ${JSON.stringify(fields)}\n`);
  provider.on('registration_create.success', (_ctx, client) => {
    event('registration', client.metadata());
  });
  provider.on('authorization.success', (ctx, out) => {
    event('authorization', { client_id: ctx.oidc.client?.clientId, code: out?.code });
  });
  provider.on('grant.success', (ctx) => {
    event('grant', { grant_type: ctx.oidc.params.grant_type, client_id: ctx.oidc.client?.clientId });
  });
  server.on('request', provider.callback());
  process.stdout.write(`READY ${port}\n`);
});

process.on('SIGTERM', () => {
  server.close();
  server.closeAllConnections();
  process.exit(0);
});
