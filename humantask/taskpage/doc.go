// Package taskpage is a sample task page in front of a humantask.Service:
// server-rendered HTML (html/template, no JavaScript, like the operator console) that
// lists the caller's user tasks and completes one through Service.Complete.
//
//	GET  /ui/                 the caller's tasks
//	GET  /ui/tasks/{id}       redirects to ?command=<id>, a command id minted for the
//	                          form (128 random bits), and shows the form: the task's
//	                          form variables as inputs, the command id and the task's
//	                          ETag (If-Match) as hidden fields; once that command was
//	                          sent, its recorded answer instead (Service.Answer)
//	POST /ui/tasks/{id}       completes it (Service.Complete) and shows the answer,
//	                          with its status
//
// The command id belongs to the rendered form, not to the click: a double click, a
// browser's resubmit and a resubmit after the back button (the browser's back/forward
// cache brings the same form back; a browser that loads the address again gets the
// command's answer) are one command, with one answer, the same page each time. A post
// runs to its answer even when the browser drops it, as a double click does to the
// first post. Only a new load of the task ("Reload the task", the list) is a new
// command. A command id is its sender's: another user opening or posting the same
// address sends a command of their own and reads nothing of the owner's answer.
//
// The answers read as pages: completed (200); "already completed by X at T" (409); "this
// task changed since you opened it; reload it" (412); "not yours" (403); "suspended" (409);
// "delegated" (409);
// the business rule's reason (422); "not settled yet, send the form again" (503).
//
// Who sends a request is what the service says (Service.Identify, its IdentitySource): behind a
// reverse proxy that authenticates users (humantask.ProxyHeader), or a proxy that passes
// a bearer token on (humantask.JWT). A browser sends no token of its own.
//
// A form post from another origin completes nothing (403): the post's Sec-Fetch-Site,
// when sent, must be same-origin, and its Origin and Referer, when sent, must name the
// page's own host (over https when the page is served over TLS). Pages forbid framing and scripts (Content-Security-Policy).
package taskpage
