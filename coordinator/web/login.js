// The sign-in form returns to the page that sent the browser here
// (/login?next=/jobs/ID). Only a path on this site: the coordinator checks
// it again (http::SafeRedirectPath) and redirects nowhere else. A file, not
// an inline script: the dashboard's CSP allows only this origin's scripts.
const next = new URLSearchParams(location.search).get('next');
if (next && /^\/(?![\/\\])[\x21-\x7e]*$/.test(next) && !next.includes('\\')) {
  document.getElementById('next').value = next;
}
