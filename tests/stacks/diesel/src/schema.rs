diesel::table! {
    items (id) {
        id -> Integer,
        name -> Text,
    }
}
