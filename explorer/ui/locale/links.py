"""Strings of the links to a view of the app (``links.*``, ``explorer/ui/links.py``): a value of a link
that the app does not know is refused in one line, in the link's language (``?lang=``) or the session's."""

STRINGS = {
    "links.refused": ("{name}={value} in the link is not one of {allowed}",
                      "链接中的 {name}={value} 不是可选值之一（可选：{allowed}）"),
}
