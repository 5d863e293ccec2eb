// Debian's chromium as every browser test starts it (make ci-deps installs it): headless, as
// root in a container, and offline but for loopback.

export const CHROMIUM = '/usr/bin/chromium';
export const ARGS = [
  '--headless',
  '--no-sandbox', // root in a container: chromium's sandbox needs user namespaces
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  // The machine has only loopback: a name lookup elsewhere fails at once (a login page's
  // stylesheet imports a web font; the status page must load nothing from elsewhere, which
  // then shows in its report) instead of waiting on a resolver, and no proxy from the
  // environment is tried.
  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost',
  '--no-proxy-server',
];
