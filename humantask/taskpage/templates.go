package taskpage

import (
	"html/template"
	"strings"

	"github.com/extworker/extworker/internal/termsafe"
)

// style is the pages' only style sheet, inline (its hash is in the
// Content-Security-Policy).
const style = `
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #1d2430; background: #f5f6f8; }
header { background: #243447; color: #fff; padding: .7em 1.5em; display: flex; justify-content: space-between; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
main { max-width: 52em; margin: 1.5em auto; background: #fff; padding: 1.2em 1.8em 1.8em; border-radius: 6px; box-shadow: 0 1px 3px rgba(0,0,0,.12); }
h1 { font-size: 1.4em; margin: .3em 0 .8em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .45em .6em; border-bottom: 1px solid #e3e6ea; vertical-align: top; }
th { font-weight: 600; color: #4a5565; width: 12em; }
input[type=text], input[type=number] { font: inherit; padding: .3em .45em; width: 18em; border: 1px solid #b8c0cc; border-radius: 4px; }
button { font: inherit; font-weight: 600; padding: .5em 1.4em; margin-top: 1.2em; border: 0; border-radius: 4px; background: #2f6fdf; color: #fff; cursor: pointer; }
.outcome { padding: .9em 1.1em; border-radius: 5px; margin-bottom: 1em; border-left: 6px solid; }
.completed { background: #e8f6ec; border-color: #2e9e4f; }
.conflict, .refused, .unsettled { background: #fff6e0; border-color: #d99a00; }
.stale, .forbidden, .gone, .error { background: #fdecec; border-color: #d33c3c; }
.meta { color: #5b6676; font-size: .9em; }
code { font-size: .9em; background: #eef0f3; padding: .1em .3em; border-radius: 3px; }
`

var templates = template.Must(template.New("").Funcs(template.FuncMap{"join": strings.Join, "shown": termsafe.String}).Parse(`
{{define "head"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{shown .Title}}</title><style>{{.Style}}</style></head>
<body><header><a href="{{.Path}}/">Tasks</a>{{if .User}}<span>Signed in as <strong id="user">{{shown .User}}</strong></span>{{end}}</header><main>
{{end}}
{{define "foot"}}</main></body></html>{{end}}

{{define "list"}}{{template "head" .}}<h1>{{shown .Title}}</h1>
{{if .Note}}<p id="unavailable">{{.Note}}</p>{{end}}
{{if .Tasks}}<table id="tasks"><tr><th>Task</th><th>Assignee</th><th>Candidates</th></tr>
{{range .Tasks}}<tr><td><a class="task" href="{{$.Path}}/tasks/{{.ID}}">{{if .Name}}{{shown .Name}}{{else}}{{shown .TaskDefinitionKey}}{{end}}</a> <span class="meta">{{.ID}}</span></td>
<td>{{shown (or .Assignee "—")}}</td><td>{{shown (join .CandidateUsers ", ")}}{{if .CandidateGroups}} (groups: {{shown (join .CandidateGroups ", ")}}){{end}}</td></tr>
{{end}}</table>{{else}}<p id="no-tasks">No task waits for you.</p>{{end}}
{{template "foot" .}}{{end}}

{{define "form"}}{{template "head" .}}<h1>{{shown .Title}}</h1>
<p class="meta">Task <code id="task-id">{{.Task.ID}}</code>{{if .Task.Assignee}}, assigned to <strong id="assignee">{{shown .Task.Assignee}}</strong>{{else}}, unassigned (candidates: {{shown (join .Task.CandidateUsers ", ")}}{{if .Task.CandidateGroups}}; groups: {{shown (join .Task.CandidateGroups ", ")}}{{end}}){{end}}</p>
<form method="post" action="{{.Path}}/tasks/{{.Task.ID}}" id="complete-form">
<input type="hidden" name="command" value="{{.Command}}">
<input type="hidden" name="etag" value="{{.Task.ETag}}">
<table>
{{range .Fields}}<tr><th><label for="var.{{.Name}}">{{shown .Name}}</label></th><td>
{{if eq .Kind "boolean"}}<input type="hidden" name="kind.{{.Name}}" value="boolean"><input type="checkbox" id="var.{{.Name}}" name="var.{{.Name}}" value="true"{{if .Checked}} checked{{end}}>
{{else if eq .Kind "number"}}<input type="hidden" name="kind.{{.Name}}" value="number"><input type="number" step="{{.Step}}" id="var.{{.Name}}" name="var.{{.Name}}" value="{{.Value}}">
{{else if eq .Kind "string"}}<input type="hidden" name="kind.{{.Name}}" value="string"><input type="text" id="var.{{.Name}}" name="var.{{.Name}}" value="{{.Value}}">
{{else}}<code>{{shown .Value}}</code> <span class="meta">(shown, not sent)</span>{{end}}
</td></tr>
{{else}}<tr><td colspan="2" class="meta">This task's form has no variables.</td></tr>{{end}}
</table>
<button type="submit" id="complete">Complete</button>
</form>
<p class="meta">Sending this form twice (a double click, the back button) is one command: <code id="command">{{.Command}}</code>.</p>
{{template "foot" .}}{{end}}

{{define "result"}}{{template "head" .}}<h1>{{shown .Title}}</h1>
<div id="result" class="outcome {{.Outcome}}" data-status="{{.Status}}">{{if .Note}}<p id="note">{{.Note}}</p>{{end}}<p id="message">{{shown .Message}}</p>
{{if .Answer.CompletedBy}}<p>Completed by <strong id="completed-by">{{shown .Answer.CompletedBy}}</strong>{{if .At}} at <span id="completed-at">{{.At}}</span>{{end}}</p>{{end}}
</div>
<p class="meta">Task <code>{{.TaskID}}</code>, command <code id="command">{{.Command}}</code>, answer {{.Status}}.</p>
<p>{{if .Reload}}<a id="reload" href="{{.Path}}/tasks/{{.TaskID}}">Reload the task</a> · {{end}}<a id="back" href="{{.Path}}/">Back to your tasks</a></p>
{{template "foot" .}}{{end}}

{{define "message"}}{{template "head" .}}<h1>{{.Title}}</h1>
<div id="result" class="outcome error"><p id="message">{{shown .Message}}</p></div>
<p><a id="back" href="{{.Path}}/">Back to your tasks</a></p>
{{template "foot" .}}{{end}}
`))
