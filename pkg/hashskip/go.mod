module github.com/kubelift/kubelift/pkg/hashskip

go 1.22
