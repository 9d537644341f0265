// The static web server that stands in for nginx in the ferrol stacks' `web` Deployment on real nodes (issue 39):
// this project's own program, named cso.test/web, never nginx. The standard library only.
module cso.local/hack/testenv/web

go 1.24
