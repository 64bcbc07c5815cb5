-- A helper module that requires itself: an error, not a hang.
return require("self_require")
